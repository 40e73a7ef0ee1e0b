// A replica source read from a file, one replica a line:
//
//     # comment
//     tcp://10.0.0.2:7000 weight=2 group=canary
//     tcp://[fd00::3]:7000            # a trailing comment
//
// The file is re-read when inotify on its directory says it was written and closed, renamed into
// place or removed (so `mv new replicas.txt` and editors that save by renaming are seen), when
// another name in the directory changed and the file's inode, size or modification time with it
// (a symlink through a renamed link, as in a Kubernetes ConfigMap volume), and when the `poll`
// timer finds them changed (file systems without inotify events, e.g. NFS, or a write through a
// hard link elsewhere). Write the file elsewhere and
// rename it into place: a reader that races an in-place write may see a partial file, and the
// write's close then makes it read again.
//
// Bounds: a file over 1 MiB or over 10,000 lines is refused whole (a failure: the last good set
// stays). A line left out (an address ordo cannot parse, a bad weight, an unknown attribute, a
// URL listed twice) is reported as "file:PATH:LINE: why" and counted in `rejected`; the other
// lines still form the set. A missing or unreadable file, or one with no usable line, is a
// failure. The set is sorted by URL. The file is read on the source's executor with plain
// read(2) calls (at most 1 MiB, never from a FIFO or a device: those are refused).
#include "ordo/fleet/sources.hpp"

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <system_error>

#include <asio/posix/stream_descriptor.hpp>

#include "fleet/entry.hpp"
#include "fleet/last_good_set.hpp"
#include "fleet/source_handle.hpp"
#include "ordo/address.hpp"
#include "ordo/error.hpp"

namespace ordo {
namespace {

constexpr std::size_t max_file_bytes = 1 << 20;
constexpr std::size_t max_file_lines = 10'000;
constexpr double max_weight = 1'000'000;

std::string errno_text(int e) { return std::error_code(e, std::system_category()).message(); }

// What the poll timer compares; equal signatures: the file is taken as unchanged.
struct file_signature {
    bool exists = false;
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    std::int64_t mtime_ns = 0;
    bool operator==(const file_signature&) const = default;
};

file_signature signature_of(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return {};
    return {true, st.st_dev, st.st_ino, st.st_size,
            std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec};
}

// The whole file, or why it cannot be used.
struct file_text {
    std::string text;
    std::string error;
};

file_text read_bounded(const std::string& path) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return {{}, "cannot open: " + errno_text(errno)};
    file_text out;
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        out.error = "cannot stat: " + errno_text(errno);
    } else if (!S_ISREG(st.st_mode)) {
        out.error = "not a regular file";
    } else if (static_cast<std::uint64_t>(st.st_size) > max_file_bytes) {
        out.error = "is " + std::to_string(st.st_size) + " bytes, over the limit of 1 MiB";
    } else {
        // It may grow while read: never more than the limit plus one byte is kept.
        out.text.resize(max_file_bytes + 1);
        std::size_t got = 0;
        while (got < out.text.size()) {
            const ssize_t n = ::read(fd, out.text.data() + got, out.text.size() - got);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                out.error = "cannot read: " + errno_text(errno);
                break;
            }
            if (n == 0) break;
            got += static_cast<std::size_t>(n);
        }
        out.text.resize(got);
        if (out.error.empty() && got > max_file_bytes)
            out.error = "grew over the limit of 1 MiB while read";
    }
    ::close(fd);
    if (!out.error.empty()) out.text.clear();
    return out;
}

// One parsed file: the members, and the lines left out ("LINE: why").
struct parsed_file {
    std::vector<member> members;
    std::vector<std::string> left_out;
    std::string error;  // the whole file is refused
};

std::string without_ordo_prefix(std::string s) {
    return s.rfind("ordo: ", 0) == 0 ? s.substr(6) : s;
}

// One line's member, or why it is left out.
std::optional<member> parse_line(const std::vector<std::string_view>& tokens,
                                 const std::string& url_suffix, std::string& why) {
    member m;
    m.url = detail::fleet_entry_url(tokens[0], url_suffix, why);
    if (!why.empty()) {
        why = without_ordo_prefix(why);
        return std::nullopt;
    }
    try {
        const address a = parse_address(m.url);
        if (!a.has_path() && a.port == 0) {
            why = "\"" + m.url + "\" has port 0 (a replica needs the port it listens on)";
            return std::nullopt;
        }
    } catch (const std::system_error& e) {
        why = without_ordo_prefix(e.what());
        return std::nullopt;
    }
    bool have_weight = false, have_group = false;
    for (std::size_t i = 1; i < tokens.size(); ++i) {
        const auto t = tokens[i];
        if (t.rfind("weight=", 0) == 0) {
            const auto v = t.substr(7);
            double w = 0;
            const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), w);
            if (have_weight) {
                why = "weight given twice";
            } else if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(w) ||
                       w <= 0 || w > max_weight) {
                why = "bad weight \"" + std::string(v) + "\" (a number > 0 and <= 1000000)";
            }
            if (!why.empty()) return std::nullopt;
            have_weight = true;
            m.weight = w;
        } else if (t.rfind("group=", 0) == 0) {
            if (have_group || t.size() == 6) {
                why = have_group ? "group given twice" : "empty group";
                return std::nullopt;
            }
            have_group = true;
            m.group = std::string(t.substr(6));
        } else {
            why = "unknown attribute \"" + std::string(t) + "\" (expected weight=W or group=G)";
            return std::nullopt;
        }
    }
    return m;
}

parsed_file parse_replicas(std::string_view text, const std::string& url_suffix) {
    parsed_file out;
    std::map<std::string, std::size_t> line_of;  // URL -> the line that listed it
    std::size_t line_no = 0;
    while (!text.empty()) {
        if (++line_no > max_file_lines) {
            out.error = "has more than 10000 lines";
            out.members.clear();
            out.left_out.clear();
            return out;
        }
        const auto nl = text.find('\n');
        auto line = text.substr(0, nl);
        text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
        std::vector<std::string_view> tokens;
        for (std::size_t i = 0; i < line.size();) {
            while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
            if (i == line.size() || line[i] == '#') break;  // the rest is a comment
            const auto start = i;
            while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
            tokens.push_back(line.substr(start, i - start));
        }
        if (tokens.empty()) continue;
        std::string why;
        auto m = parse_line(tokens, url_suffix, why);
        if (m) {
            auto [it, fresh] = line_of.emplace(m->url, line_no);
            if (!fresh) why = "\"" + m->url + "\" is already listed on line " +
                              std::to_string(it->second);
            else out.members.push_back(std::move(*m));
        }
        if (!why.empty()) out.left_out.push_back(std::to_string(line_no) + ": " + why);
    }
    std::sort(out.members.begin(), out.members.end(),
              [](const member& a, const member& b) { return a.url < b.url; });
    return out;
}

class file_state : public std::enable_shared_from_this<file_state> {
  public:
    file_state(net::any_io_executor ex, file_source_options o)
        : ex_(ex), o_(std::move(o)), poll_timer_(ex), events_(ex) {
        if (o_.path.empty()) throw_error(errc::bad_address, "ordo: file source: no path");
        if (o_.poll.count() <= 0)
            throw_error(errc::bad_address, "ordo: file source " + o_.path + ": poll must be > 0");
        const auto slash = o_.path.rfind('/');
        dir_ = slash == std::string::npos ? "." : slash == 0 ? "/" : o_.path.substr(0, slash);
        base_ = slash == std::string::npos ? o_.path : o_.path.substr(slash + 1);
        describe_ = "file:" + o_.path;
    }

    void start(std::function<void(std::vector<member>)> update,
               std::function<void(const std::string&)> problem) {
        if (started_ || stopped_) return;
        started_ = true;
        set_.start(std::move(update), std::move(problem));
        // Posted: no callback runs inside start().
        net::post(ex_, [self = shared_from_this()] {
            if (self->stopped_) return;
            self->watch_directory();
            self->reread();
            self->arm_poll();
        });
    }

    // The file is read when it changes; a lost replica does not change it.
    void refresh_now() {}

    void stop() {
        if (stopped_) return;
        stopped_ = true;
        poll_timer_.cancel();
        std::error_code ignored;
        events_.close(ignored);  // the inotify descriptor is ours
        set_.stop();
    }

    std::string describe() const { return describe_; }
    source_counters counters() const { return set_.counters(); }

  private:
    void watch_directory() {
        const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        std::string why;
        if (fd < 0) {
            why = "inotify_init1: " + errno_text(errno);
        } else if (::inotify_add_watch(fd, dir_.c_str(),
                                       IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE |
                                           IN_DELETE_SELF | IN_MOVE_SELF) < 0) {
            why = "cannot watch directory " + dir_ + ": " + errno_text(errno);
            ::close(fd);
        } else {
            events_.assign(fd);
            read_events();
            return;
        }
        set_.say(describe_ + ": " + why + "; checking every " + std::to_string(o_.poll.count()) +
            " ms instead");
    }

    void read_events() {
        events_.async_read_some(
            net::buffer(event_buf_), [self = shared_from_this()](std::error_code ec, std::size_t n) {
                if (ec || self->stopped_) return;  // closed by stop(), or the watch is gone
                // Another name changed: the file may be a symlink through it (a Kubernetes
                // ConfigMap swaps its ..data link), which stat() follows.
                if (self->names_the_file(n) || signature_of(self->o_.path) != self->seen_)
                    self->reread();
                if (!self->stopped_ && self->events_.is_open()) self->read_events();
            });
    }

    // Whether the events in event_buf_[0, n) concern the file (or may have: an overflow).
    bool names_the_file(std::size_t n) {
        bool ours = false;
        for (std::size_t at = 0; at + sizeof(inotify_event) <= n;) {
            inotify_event ev;
            std::memcpy(&ev, event_buf_.data() + at, sizeof ev);
            const char* name = event_buf_.data() + at + sizeof ev;
            if (ev.mask & IN_Q_OVERFLOW) ours = true;
            if (ev.len > 0 && at + sizeof ev + ev.len <= n &&
                std::string_view(name, ::strnlen(name, ev.len)) == base_)
                ours = true;
            if (ev.mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF)) {
                // The directory went away: the poll timer alone watches from now on.
                std::error_code ignored;
                events_.close(ignored);
                ours = true;
            }
            at += sizeof ev + ev.len;
        }
        return ours;
    }

    void arm_poll() {
        poll_timer_.expires_after(o_.poll);
        poll_timer_.async_wait([self = shared_from_this()](std::error_code ec) {
            if (ec || self->stopped_) return;
            if (signature_of(self->o_.path) != self->seen_) self->reread();
            if (!self->stopped_) self->arm_poll();
        });
    }

    void fail(const std::string& why) {
        set_.failed(describe_ + ": " + why + (set_.has_set() ? " (the last good set stays)" : ""));
    }

    void reread() {
        seen_ = signature_of(o_.path);
        file_text f = read_bounded(o_.path);
        if (!f.error.empty()) {
            last_text_.reset();
            fail(f.error);
            return;
        }
        if (last_text_ && *last_text_ == f.text) return;  // read already, reported already
        last_text_ = f.text;
        parsed_file p = parse_replicas(f.text, o_.url_suffix);
        for (const auto& why : p.left_out) {
            set_.left_out("file:" + o_.path + ":" + why);
            if (stopped_) return;
        }
        if (p.error.empty() && p.members.empty())
            p.error = p.left_out.empty()
                          ? "lists no replica"
                          : "no usable replica (" + std::to_string(p.left_out.size()) +
                                " line(s) left out)";
        if (!p.error.empty()) {
            fail(p.error);
            return;
        }
        set_.found(std::move(p.members));
    }

    net::any_io_executor ex_;
    file_source_options o_;
    std::string dir_, base_, describe_;
    net::steady_timer poll_timer_;
    net::posix::stream_descriptor events_;
    std::array<char, 8192> event_buf_{};
    file_signature seen_;
    std::optional<std::string> last_text_;

    detail::last_good_set set_;
    bool started_ = false, stopped_ = false;
};

}  // namespace

std::unique_ptr<replica_source> make_file_source(net::any_io_executor ex, file_source_options o) {
    // inotify and timers stay with the state, which handlers still queued may hold.
    return std::make_unique<detail::source_handle<file_state>>(
        std::make_shared<file_state>(ex, std::move(o)));
}

}  // namespace ordo
