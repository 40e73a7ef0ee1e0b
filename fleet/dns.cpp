#include "ordo/fleet/sources.hpp"

#include <ares.h>
#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <system_error>

#include <asio/posix/stream_descriptor.hpp>

#include "fleet/last_good_set.hpp"
#include "fleet/source_handle.hpp"
#include "ordo/address.hpp"
#include "ordo/error.hpp"

// A DNS replica source on c-ares, driven by the source's executor: c-ares tells which of its
// sockets it wants read or written (ARES_OPT_SOCK_STATE_CB), each such socket is waited on by
// an asio::posix::stream_descriptor that never owns it (c-ares opens and closes its sockets; the
// descriptor is released, never closed), and a timer runs ares_timeout's deadlines. No thread,
// no blocking call.
//
// Choices (docs/router-and-fleets.md, "Running a fleet"):
// - A host name gives one member per A and AAAA address, on options.port, weight 1.
// - An SRV name: only the records of the lowest priority present are used (the others are
//   fallbacks that DNS clients try when all of those fail; a router reaches the same end by
//   reconnecting, so it does not mix them in). Each record's target is then looked up (A and
//   AAAA) and gives a member per address on the record's port. The SRV weight is the member's
//   weight, except 0 (RFC 2782: "very small chance"), which becomes 1, the smallest positive SRV
//   weight, since a router's weights must be positive. Two records giving the same address and
//   port make one member whose weight is their sum.
// - A target that DNS says does not exist (NXDOMAIN, or no A/AAAA record) is left out of the
//   set with a problem line and counted in `rejected`; any other failure of a target's lookup
//   (timeout, SERVFAIL, malformed answer) fails the whole lookup, since the set would be
//   partial for a passing reason and the last good set is the better guess.
// - The set is sorted by URL, so that the same answer in another order is not a change.
// - Names are looked up in DNS only (not /etc/hosts), with the search domains and ndots of
//   /etc/resolv.conf, as a resolver in a Kubernetes pod does; a name ending in '.' is absolute.
//   An IP literal (as a host name or an SRV target) is used as it is.
// - A and AAAA are asked for separately: a name with addresses of one family is fine whatever
//   happened to the other query; with none, the reason given is the first failure that is not
//   "no such name or record" (a malformed answer, a timeout), else NXDOMAIN or NODATA.
// - Each stage of a lookup (the SRV query, then its targets' addresses) takes at most `timeout`:
//   c-ares tries twice, first after timeout / 3, then after twice that. A guard cancels a whole
//   lookup still running after 2 * timeout + 1 s.
namespace ordo {
namespace {

using clock_type = std::chrono::steady_clock;

const char* ares_code_name(int status) {
    switch (status) {
        case ARES_ENODATA: return "ARES_ENODATA";
        case ARES_EFORMERR: return "ARES_EFORMERR";
        case ARES_ESERVFAIL: return "ARES_ESERVFAIL";
        case ARES_ENOTFOUND: return "ARES_ENOTFOUND";
        case ARES_ENOTIMP: return "ARES_ENOTIMP";
        case ARES_EREFUSED: return "ARES_EREFUSED";
        case ARES_EBADQUERY: return "ARES_EBADQUERY";
        case ARES_EBADNAME: return "ARES_EBADNAME";
        case ARES_EBADFAMILY: return "ARES_EBADFAMILY";
        case ARES_EBADRESP: return "ARES_EBADRESP";
        case ARES_ECONNREFUSED: return "ARES_ECONNREFUSED";
        case ARES_ETIMEOUT: return "ARES_ETIMEOUT";
        case ARES_EOF: return "ARES_EOF";
        case ARES_EFILE: return "ARES_EFILE";
        case ARES_ENOMEM: return "ARES_ENOMEM";
        case ARES_EDESTRUCTION: return "ARES_EDESTRUCTION";
        case ARES_EBADSTR: return "ARES_EBADSTR";
        case ARES_ECANCELLED: return "ARES_ECANCELLED";
        default: return "ARES_E?";
    }
}

// c-ares' sentence and code, e.g. "Timeout while contacting DNS servers (ARES_ETIMEOUT)".
std::string ares_reason(int status) {
    return std::string(ares_strerror(status)) + " (" + ares_code_name(status) + ")";
}

void init_library() {
    static std::once_flag once;
    std::call_once(once, [] {
        if (int st = ares_library_init(ARES_LIB_INIT_ALL); st != ARES_SUCCESS)
            throw std::system_error(std::make_error_code(std::errc::io_error),
                                    "ordo: c-ares cannot start: " + ares_reason(st));
    });
}

// The channel's nameservers as "ip:port" (IPv6 in brackets), joined by ", ".
std::string nameservers_of(ares_channel ch) {
    ares_addr_port_node* servers = nullptr;
    if (ares_get_servers_ports(ch, &servers) != ARES_SUCCESS) return "?";
    std::string out;
    for (auto* s = servers; s; s = s->next) {
        char ip[INET6_ADDRSTRLEN] = {};
        ::inet_ntop(s->family, &s->addr, ip, sizeof ip);
        if (!out.empty()) out += ", ";
        const bool v6 = s->family == AF_INET6;
        out += (v6 ? "[" : "") + std::string(ip) + (v6 ? "]" : "") + ":" +
               std::to_string(s->udp_port ? s->udp_port : 53);
    }
    ares_free_data(servers);
    return out.empty() ? "none" : out;
}

class dns_state : public std::enable_shared_from_this<dns_state> {
  public:
    // Throws std::system_error (errc::bad_address) for options that can never work.
    dns_state(net::any_io_executor ex, dns_source_options o)
        : ex_(ex), o_(std::move(o)), refresh_timer_(ex), guard_(ex), ares_timer_(ex) {
        const std::string what = "ordo: dns source \"" + o_.name + "\": ";
        if (o_.name.empty()) throw_error(errc::bad_address, what + "no name to look up");
        srv_ = o_.name.front() == '_';
        if (!srv_ && o_.port == 0)
            throw_error(errc::bad_address, what + "a host name (not SRV) needs a port");
        // The URLs it will make must parse: a bad scheme or suffix is the caller's mistake.
        try {
            parse_address(o_.scheme + "://127.0.0.1:1" + o_.url_suffix);
        } catch (const std::system_error& e) {
            throw_error(errc::bad_address, what + e.what());
        }
        if (o_.refresh.count() <= 0 || o_.min_refresh.count() < 0 || o_.timeout.count() <= 0)
            throw_error(errc::bad_address, what + "refresh and timeout must be positive");
        init_library();
        ares_options opts{};
        opts.sock_state_cb = &dns_state::on_sock_state;
        opts.sock_state_cb_data = this;
        opts.timeout = static_cast<int>(std::max<std::int64_t>(o_.timeout.count() / 3, 10));
        opts.tries = 2;
        const int mask = ARES_OPT_SOCK_STATE_CB | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES;
        if (int st = ares_init_options(&channel_, &opts, mask); st != ARES_SUCCESS)
            throw std::system_error(std::make_error_code(std::errc::io_error),
                                    what + "c-ares cannot start: " + ares_reason(st));
        if (!o_.nameserver.empty()) {
            if (int st = ares_set_servers_ports_csv(channel_, o_.nameserver.c_str());
                st != ARES_SUCCESS) {
                ares_destroy(channel_);
                channel_ = nullptr;
                throw_error(errc::bad_address, what + "bad nameserver \"" + o_.nameserver +
                                                   "\" (expected ip, ip:port or [ipv6]:port): " +
                                                   ares_reason(st));
            }
        }
        describe_ = "dns:" + o_.name + " (nameserver " + nameservers_of(channel_) + ")";
    }

    ~dns_state() { destroy_channel(); }

    void start(std::function<void(std::vector<member>)> update,
               std::function<void(const std::string&)> problem) {
        if (started_ || stopped_) return;
        started_ = true;
        set_.start(std::move(update), std::move(problem));
        // Posted: no callback runs inside start().
        net::post(ex_, [self = shared_from_this()] {
            if (!self->stopped_ && !self->in_flight_) self->begin_lookup();
        });
    }

    void refresh_now() {
        if (!started_ || stopped_) return;
        if (in_flight_) {
            again_ = true;  // one more lookup after this one, rate-limited in finish()
            return;
        }
        const auto due = std::max(clock_type::now(), last_start_ + o_.min_refresh);
        if (due < refresh_timer_.expiry()) arm_refresh(due);
    }

    void stop() {
        if (stopped_) return;
        stopped_ = true;
        refresh_timer_.cancel();
        guard_.cancel();
        ares_timer_.cancel();
        destroy_channel();
        set_.stop();
    }

    std::string describe() const { return describe_; }
    source_counters counters() const { return set_.counters(); }

  private:
    // One socket that c-ares uses, watched for what c-ares wants.
    struct watch {
        watch(net::any_io_executor ex, int fd, std::uint64_t serial)
            : d(ex, fd), serial(serial) {}
        net::posix::stream_descriptor d;
        std::uint64_t serial;
        bool want_read = false, want_write = false;
        bool reading = false, writing = false;  // a wait is queued
    };

    // The A and AAAA queries for one name of the lookup under way.
    struct name_lookup {
        std::string name;
        std::uint16_t port = 0;
        double weight = 1;
        int pending = 2;
        std::set<std::string> urls;
        int hard = ARES_SUCCESS;  // the first failure other than "no such name or record"
        int none = ARES_SUCCESS;  // the first "no such name or record" (NXDOMAIN, NODATA)
    };

    // One c-ares query of the lookup under way: SRV (n == nullptr), A or AAAA.
    struct query {
        dns_state* s;
        std::uint64_t lookup;
        name_lookup* n;
        int type;
    };

    void destroy_channel() {
        // Descriptors first: release() cancels their waits and leaves the sockets to c-ares,
        // which closes them in ares_destroy (and calls every query's callback, which sees
        // stopped_ and does nothing).
        for (auto& [fd, w] : watches_) w->d.release();
        watches_.clear();
        if (channel_) {
            ares_destroy(channel_);
            channel_ = nullptr;
        }
    }

    static void on_sock_state(void* data, ares_socket_t fd, int readable, int writable) {
        static_cast<dns_state*>(data)->sock_state(fd, readable != 0, writable != 0);
    }

    // c-ares calls this before it closes a socket (both false) and whenever what it waits
    // for changes.
    void sock_state(int fd, bool readable, bool writable) {
        auto it = watches_.find(fd);
        if (!readable && !writable) {
            if (it != watches_.end()) {
                it->second->d.release();
                watches_.erase(it);
            }
            return;
        }
        if (stopped_) return;
        if (it == watches_.end()) {
            try {
                it = watches_.emplace(fd, std::make_unique<watch>(ex_, fd, ++serial_)).first;
            } catch (const std::system_error& e) {
                // The reactor refused the socket: c-ares' own timeout ends the query.
                note_failure("cannot watch a c-ares socket: " + std::string(e.what()));
                return;
            }
        }
        it->second->want_read = readable;
        it->second->want_write = writable;
        arm(*it->second);
    }

    void arm(watch& w) {
        bool armed = false;
        if (w.want_read && !w.reading) {
            w.reading = armed = true;
            w.d.async_wait(net::posix::descriptor_base::wait_read,
                           [self = shared_from_this(), fd = w.d.native_handle(),
                            serial = w.serial](std::error_code ec) {
                               self->ready(fd, serial, ec, true);
                           });
        }
        if (w.want_write && !w.writing) {
            w.writing = armed = true;
            w.d.async_wait(net::posix::descriptor_base::wait_write,
                           [self = shared_from_this(), fd = w.d.native_handle(),
                            serial = w.serial](std::error_code ec) {
                               self->ready(fd, serial, ec, false);
                           });
        }
        // Asio's reactor waits on edge-triggered epoll, and a wait queued after the socket
        // became ready sees no edge: what is already there is found with poll() instead.
        if (armed) {
            pollfd p{w.d.native_handle(),
                     static_cast<short>((w.want_read ? POLLIN : 0) | (w.want_write ? POLLOUT : 0)),
                     0};
            if (::poll(&p, 1, 0) > 0 && p.revents != 0) {
                net::post(ex_, [self = shared_from_this(), fd = p.fd, serial = w.serial,
                                ev = p.revents] {
                    if (self->stopped_ || !self->current(fd, serial)) return;
                    const bool in = (ev & (POLLIN | POLLERR | POLLHUP)) != 0;
                    const bool out = (ev & (POLLOUT | POLLERR | POLLHUP)) != 0;
                    self->process(in ? fd : ARES_SOCKET_BAD, out ? fd : ARES_SOCKET_BAD);
                });
            }
        }
    }

    watch* current(int fd, std::uint64_t serial) {
        auto it = watches_.find(fd);
        return it != watches_.end() && it->second->serial == serial ? it->second.get() : nullptr;
    }

    void ready(int fd, std::uint64_t serial, std::error_code ec, bool read) {
        if (stopped_) return;
        watch* w = current(fd, serial);
        if (!w) return;  // c-ares closed it (and may have reused the number)
        (read ? w->reading : w->writing) = false;
        if (ec) return;  // cancelled: released
        process(read ? fd : ARES_SOCKET_BAD, read ? ARES_SOCKET_BAD : fd);
        if (watch* again = current(fd, serial)) arm(*again);
    }

    // Lets c-ares read, write and run its deadlines; query callbacks run inside.
    void process(ares_socket_t r, ares_socket_t w) {
        ares_process_fd(channel_, r, w);
        schedule_ares_timer();
    }

    void schedule_ares_timer() {
        if (stopped_ || !channel_) return;
        timeval tv{};
        if (!ares_timeout(channel_, nullptr, &tv)) {
            ares_timer_.cancel();
            return;
        }
        ares_timer_.expires_after(std::chrono::seconds(tv.tv_sec) +
                                  std::chrono::microseconds(tv.tv_usec) +
                                  std::chrono::milliseconds(1));
        ares_timer_.async_wait([self = shared_from_this()](std::error_code ec) {
            if (ec || self->stopped_) return;  // rescheduled or stopped
            self->process(ARES_SOCKET_BAD, ARES_SOCKET_BAD);
        });
    }

    void arm_refresh(clock_type::time_point due) {
        refresh_timer_.expires_at(due);
        refresh_timer_.async_wait([self = shared_from_this()](std::error_code ec) {
            if (ec || self->stopped_ || self->in_flight_) return;
            self->begin_lookup();
        });
    }

    void begin_lookup() {
        ++lookup_id_;
        in_flight_ = true;
        again_ = false;
        guard_fired_ = false;
        failed_ = false;
        error_.clear();
        found_.clear();
        left_out_.clear();
        last_start_ = clock_type::now();
        refresh_timer_.expires_at(clock_type::time_point::max());
        guard_.expires_after(2 * o_.timeout + std::chrono::seconds(1));
        guard_.async_wait([self = shared_from_this(), id = lookup_id_](std::error_code ec) {
            if (ec || self->stopped_ || !self->in_flight_ || self->lookup_id_ != id) return;
            self->guard_fired_ = true;
            ares_cancel(self->channel_);  // each query's callback: ARES_ECANCELLED
            self->schedule_ares_timer();
        });
        ++pending_;  // held until every query below is sent: finish() waits for all of them
        names_.clear();
        if (srv_) {
            ++pending_;
            ares_query(channel_, o_.name.c_str(), ns_c_in, ns_t_srv, &dns_state::on_answer,
                       new query{this, lookup_id_, nullptr, ns_t_srv});
        } else {
            resolve(o_.name, o_.port, 1);
        }
        schedule_ares_timer();
        query_done();
    }

    // Asks for the A and AAAA records of `name` (with the search domains of resolv.conf).
    void resolve(const std::string& name, std::uint16_t port, double weight) {
        auto& n = *names_.emplace_back(std::make_unique<name_lookup>());
        n.name = name;
        n.port = port;
        n.weight = weight;
        // An IP literal is its own address.
        in6_addr literal{};
        if (::inet_pton(AF_INET, name.c_str(), &literal) == 1 ||
            ::inet_pton(AF_INET6, name.c_str(), &literal) == 1) {
            n.pending = 0;
            found_[url_of(name, port)] += weight;
            return;
        }
        for (int type : {ns_t_a, ns_t_aaaa}) {
            ++pending_;
            ares_search(channel_, name.c_str(), ns_c_in, type, &dns_state::on_answer,
                        new query{this, lookup_id_, &n, type});
        }
    }

    std::string url_of(const std::string& ip, std::uint16_t port) const {
        const bool v6 = ip.find(':') != std::string::npos;
        return o_.scheme + "://" + (v6 ? "[" : "") + ip + (v6 ? "]" : "") + ":" +
               std::to_string(port) + o_.url_suffix;
    }

    static void on_answer(void* arg, int status, int, unsigned char* buf, int len) {
        std::unique_ptr<query> q(static_cast<query*>(arg));
        if (q->n)
            q->s->address_answer(*q, status, buf, len);
        else
            q->s->srv_answer(*q, status, buf, len);
    }

    void srv_answer(const query& q, int status, unsigned char* buf, int len) {
        if (stopped_ || q.lookup != lookup_id_) return;
        if (status != ARES_SUCCESS) {
            note_failure("SRV lookup failed: " + reason(status));
        } else {
            ares_srv_reply* records = nullptr;
            if (int st = ares_parse_srv_reply(buf, len, &records); st != ARES_SUCCESS) {
                note_failure("malformed SRV answer: " + ares_reason(st));
            } else {
                use_srv_records(records);
                ares_free_data(records);
            }
        }
        query_done();
    }

    void use_srv_records(const ares_srv_reply* records) {
        unsigned short lowest = 0xffff;
        for (auto* r = records; r; r = r->next) lowest = std::min(lowest, r->priority);
        std::size_t used = 0;
        for (auto* r = records; r; r = r->next) {
            if (r->priority != lowest) continue;
            const std::string target = r->host ? r->host : "";
            if (target.empty() || target == ".") continue;  // RFC 2782: no service here
            if (r->port == 0) {
                left_out_.push_back("SRV record for target " + target + " has port 0");
                continue;
            }
            ++used;
            resolve(target, r->port, r->weight == 0 ? 1.0 : r->weight);
        }
        if (used == 0 && left_out_.empty())
            note_failure("the SRV records name no target (\".\": no service here)");
    }

    void address_answer(const query& q, int status, unsigned char* buf, int len) {
        if (stopped_ || q.lookup != lookup_id_) return;
        name_lookup& n = *q.n;
        if (status == ARES_SUCCESS) {
            hostent* h = nullptr;
            status = q.type == ns_t_a ? ares_parse_a_reply(buf, len, &h, nullptr, nullptr)
                                      : ares_parse_aaaa_reply(buf, len, &h, nullptr, nullptr);
            if (status == ARES_SUCCESS && h) {
                for (char** a = h->h_addr_list; *a; ++a) {
                    char ip[INET6_ADDRSTRLEN] = {};
                    if (::inet_ntop(h->h_addrtype, *a, ip, sizeof ip)) n.urls.insert(ip);
                }
            }
            if (h) ares_free_hostent(h);
        }
        int& first = status == ARES_ENOTFOUND || status == ARES_ENODATA ? n.none : n.hard;
        if (status != ARES_SUCCESS && first == ARES_SUCCESS) first = status;
        if (--n.pending == 0) name_done(n);
        query_done();
    }

    // Both answers are in: the name's members, or why it has none. One family's failure does
    // not matter when the other gave addresses (a server that drops AAAA queries still serves).
    void name_done(const name_lookup& n) {
        const std::string what = srv_ ? "target " + n.name + ": " : "";
        if (!n.urls.empty()) {
            for (const auto& ip : n.urls) found_[url_of(ip, n.port)] += n.weight;
        } else if (n.hard != ARES_SUCCESS) {
            note_failure(what + "address lookup failed: " + reason(n.hard));
        } else if (srv_) {
            left_out_.push_back(what + "no address: " + ares_reason(n.none));
        } else {
            note_failure("address lookup failed: " + ares_reason(n.none));
        }
    }

    std::string reason(int status) const {
        if (status == ARES_ECANCELLED && guard_fired_)
            return "no answer within " +
                   std::to_string((2 * o_.timeout + std::chrono::seconds(1)).count()) + " ms";
        return ares_reason(status);
    }

    void note_failure(std::string why) {
        if (!failed_) error_ = std::move(why);  // the first reason is the one to read
        failed_ = true;
    }

    void query_done() {
        if (--pending_ != 0) return;
        // Outside c-ares (this runs inside its callbacks), so that the user's callbacks may
        // call stop() or refresh_now().
        net::post(ex_, [self = shared_from_this(), id = lookup_id_] {
            if (!self->stopped_ && self->lookup_id_ == id && self->in_flight_) self->finish();
        });
    }

    void finish() {
        in_flight_ = false;
        guard_.cancel();
        if (!failed_ && found_.empty())
            note_failure(left_out_.empty() ? "empty answer" : "no target has an address");
        // The next lookup is planned before the callbacks, which may call refresh_now().
        auto due = clock_type::now() + o_.refresh;
        if (again_) due = std::min(due, std::max(clock_type::now(), last_start_ + o_.min_refresh));
        arm_refresh(due);

        // A callback may stop the source: then nothing more is reported.
        for (const auto& why : left_out_) {
            if (stopped_) return;
            set_.left_out(describe_ + ": " + why);
        }
        if (stopped_) return;
        if (failed_) return set_.failed(describe_ + ": " + error_);
        std::vector<member> set;
        for (const auto& [url, weight] : found_) set.push_back(member{url, weight, {}});
        set_.found(std::move(set));
    }

    net::any_io_executor ex_;
    dns_source_options o_;
    bool srv_ = false;
    std::string describe_;
    ares_channel channel_ = nullptr;
    std::map<int, std::unique_ptr<watch>> watches_;
    std::uint64_t serial_ = 0;
    net::steady_timer refresh_timer_, guard_, ares_timer_;

    detail::last_good_set set_;
    bool started_ = false, stopped_ = false;

    // The lookup under way (one at a time).
    std::uint64_t lookup_id_ = 0;
    bool in_flight_ = false, again_ = false, guard_fired_ = false, failed_ = false;
    int pending_ = 0;
    std::string error_;
    std::vector<std::unique_ptr<name_lookup>> names_;
    std::map<std::string, double> found_;  // URL -> weight
    std::vector<std::string> left_out_;
    clock_type::time_point last_start_{};

};

}  // namespace

std::unique_ptr<replica_source> make_dns_source(net::any_io_executor ex, dns_source_options o) {
    // c-ares and timers stay with the state, which handlers still queued may hold.
    return std::make_unique<detail::source_handle<dns_state>>(
        std::make_shared<dns_state>(ex, std::move(o)), true);
}

}  // namespace ordo
