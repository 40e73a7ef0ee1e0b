// Reading HTTP/1.1 requests with Node's http_parser (gateway/http.hpp). Its callbacks copy the
// parts into an http_request and keep the limits; a request's end pauses the parser, so that
// bytes pipelined after it wait for next().
#include "gateway/http.hpp"

#include <strings.h>

#include <http_parser.h>

namespace ordo::gw {

const std::string* http_request::header(std::string_view name) const {
    for (const auto& [k, v] : headers)
        if (k.size() == name.size() && strncasecmp(k.data(), name.data(), name.size()) == 0)
            return &v;
    return nullptr;
}

std::size_t http_request::count(std::string_view name) const {
    std::size_t n = 0;
    for (const auto& [k, v] : headers)
        if (k.size() == name.size() && strncasecmp(k.data(), name.data(), name.size()) == 0) ++n;
    return n;
}

namespace {

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

}  // namespace

std::string percent_decoded(std::string_view in, bool plus_is_space) {
    std::string out;
    out.reserve(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
        const char c = in[i];
        if (c == '%' && i + 2 < in.size()) {
            const int hi = hex_value(in[i + 1]), lo = hex_value(in[i + 2]);
            if (hi >= 0 && lo >= 0) {
                out += static_cast<char>(hi * 16 + lo);
                i += 2;
                continue;
            }
        }
        out += plus_is_space && c == '+' ? ' ' : c;
    }
    return out;
}

enum class stage { idle, head, body, done, failed };

struct http_reader::impl {
    impl(std::size_t head, std::size_t body) : max_head(head), max_body(body) {
        http_parser_settings_init(&settings);
        settings.on_message_begin = [](http_parser* p) { return self(p).begin(); };
        settings.on_url = [](http_parser* p, const char* at, std::size_t n) {
            return self(p).url(at, n);
        };
        settings.on_header_field = [](http_parser* p, const char* at, std::size_t n) {
            return self(p).field(at, n);
        };
        settings.on_header_value = [](http_parser* p, const char* at, std::size_t n) {
            return self(p).value(at, n);
        };
        settings.on_headers_complete = [](http_parser* p) { return self(p).headers_complete(); };
        settings.on_body = [](http_parser* p, const char* at, std::size_t n) {
            return self(p).body(at, n);
        };
        settings.on_message_complete = [](http_parser* p) { return self(p).complete(); };
        reset();
    }

    static impl& self(http_parser* p) { return *static_cast<impl*>(p->data); }

    void reset() {
        http_parser_init(&parser, HTTP_REQUEST);
        parser.data = this;
        req = http_request{};
        at = stage::idle;
        head_bytes = 0;
        in_value = false;
        streams = false;
        partial_line = 0;
    }

    int fail(int st, std::string why) {
        status = st;
        reason = std::move(why);
        at = stage::failed;
        return -1;
    }

    // The request line and headers, counted as they come (names, values and the URL, with
    // 4 bytes a line for the separators).
    int count_head(std::size_t n) {
        head_bytes += n;
        if (head_bytes > max_head)
            return fail(431, "ordo gateway: the request line and headers are over "
                             "max_header_bytes (" +
                                 std::to_string(max_head) + ")");
        return 0;
    }

    int begin() {
        at = stage::head;
        return 0;
    }
    int url(const char* p, std::size_t n) {
        req.target.append(p, n);
        return count_head(n);
    }
    int field(const char* p, std::size_t n) {
        if (in_value || req.headers.empty()) {
            req.headers.emplace_back();
            in_value = false;
            if (req.headers.size() > 100)
                return fail(431, "ordo gateway: more than 100 header lines");
        }
        req.headers.back().first.append(p, n);
        return count_head(n + 4);
    }
    int value(const char* p, std::size_t n) {
        in_value = true;
        req.headers.back().second.append(p, n);
        return count_head(n);
    }
    // RFC 9112 section 5: a field name is a token (no whitespace before the colon), and a
    // value holds no line end (no obsolete line folding): either could be read another way
    // by a proxy in front.
    static bool is_token(std::string_view name) {
        if (name.empty()) return false;
        for (const char ch : name) {
            const auto c = static_cast<unsigned char>(ch);
            if (c <= 0x20 || c >= 0x7f || std::string_view("\"(),/:;<=>?@[\\]{}").find(ch) !=
                                                std::string_view::npos)
                return false;
        }
        return true;
    }

    int headers_complete() {
        for (const auto& [name, value] : req.headers) {
            if (!is_token(name))
                return fail(400, "ordo gateway: a malformed header name (RFC 9112 section 5.1)");
            if (value.find_first_of("\r\n", 0, 3) != std::string::npos)
                return fail(400, "ordo gateway: a header value with a line end (obsolete line "
                                 "folding; RFC 9112 section 5.2)");
        }
        req.method = http_method_str(static_cast<http_method>(parser.method));
        req.major = parser.http_major;
        req.minor = parser.http_minor;
        const auto q = req.target.find('?');
        const std::string_view raw_path = std::string_view(req.target).substr(0, q);
        req.path = percent_decoded(raw_path.substr(0, raw_path.find('#')), false);
        if (q != std::string::npos) {
            std::string_view query = std::string_view(req.target).substr(q + 1);
            req.query = std::string(query.substr(0, query.find('#')));
        }
        // RFC 9112 section 6.3: one unambiguous length. http_parser refuses a second
        // Content-Length and one beside Transfer-Encoding; a list of lengths too ("1, 1" is
        // not a number).
        if ((parser.flags & F_CONTENTLENGTH) && (parser.flags & F_CHUNKED))
            return fail(400, "ordo gateway: Content-Length with Transfer-Encoding (RFC 9112 "
                             "section 6.3)");
        // An NDJSON body is a stream of items (a client or two-way stream): read as it is
        // taken, each line within max_body (body()), whatever its length in all.
        if (const std::string* type = req.header("Content-Type")) {
            const std::string_view t(*type);
            const std::string_view bare = t.substr(0, t.find(';'));
            streams = bare.size() >= 20 && strncasecmp(bare.data(), "application/x-ndjson", 20) == 0 &&
                      bare.find_first_not_of(" \t", 20) == std::string_view::npos;
        }
        if (!streams && (parser.flags & F_CONTENTLENGTH) && parser.content_length > max_body)
            return fail(413, "ordo gateway: a body of " + std::to_string(parser.content_length) +
                                 " bytes is over max_body_bytes (" + std::to_string(max_body) +
                                 ")");
        at = stage::body;
        return 0;
    }
    int body(const char* p, std::size_t n) {
        if (streams) {
            // Lines are taken as they come: what bounds the bytes held is what the taker feeds;
            // here, the line not yet ended.
            const std::string_view in(p, n);
            const auto nl = in.rfind('\n');
            partial_line = nl == std::string_view::npos ? partial_line + n : n - nl - 1;
            if (partial_line > max_body)
                return fail(413, "ordo gateway: an NDJSON line is over max_body_bytes (" +
                                     std::to_string(max_body) + ")");
        } else if (req.body.size() + n > max_body) {
            return fail(413, "ordo gateway: the body is over max_body_bytes (" +
                                 std::to_string(max_body) + ")");
        }
        req.body.append(p, n);
        return 0;
    }
    int complete() {
        req.keep_alive = http_should_keep_alive(&parser) != 0;
        at = stage::done;
        http_parser_pause(&parser, 1);
        return 0;
    }

    std::size_t feed(std::string_view in) {
        if (at == stage::done || at == stage::failed || in.empty()) return 0;
        const std::size_t n = http_parser_execute(&parser, &settings, in.data(), in.size());
        const auto e = HTTP_PARSER_ERRNO(&parser);
        if (at == stage::failed || at == stage::done) return n;
        if (parser.upgrade)
            fail(400, "ordo gateway: protocol upgrades (and CONNECT) are not served");
        else if (e == HPE_INVALID_CONTENT_LENGTH || e == HPE_UNEXPECTED_CONTENT_LENGTH ||
                 e == HPE_INVALID_TRANSFER_ENCODING)
            fail(400, std::string("ordo gateway: an ambiguous or malformed body length (") +
                          http_errno_description(e) + "; RFC 9112 section 6.3)");
        else if (e == HPE_HEADER_OVERFLOW)
            fail(431, "ordo gateway: the request line and headers are over max_header_bytes (" +
                          std::to_string(max_head) + ")");
        else if (e != HPE_OK)
            fail(400, std::string("ordo gateway: a malformed request (") +
                          http_errno_description(e) + ")");
        return n;
    }

    http_parser parser{};
    http_parser_settings settings{};
    const std::size_t max_head, max_body;
    http_request req;
    stage at = stage::idle;
    std::size_t head_bytes = 0;
    bool in_value = false;
    bool streams = false;  // an NDJSON body, taken as it comes
    std::size_t partial_line = 0;  // its bytes since the last line end
    int status = 0;
    std::string reason;
};

http_reader::http_reader(std::size_t max_head_bytes, std::size_t max_body_bytes)
    : p_(std::make_unique<impl>(max_head_bytes, max_body_bytes)) {}
http_reader::~http_reader() = default;

std::size_t http_reader::feed(std::string_view in) {
    return p_->feed(in);
}
bool http_reader::idle() const noexcept {
    return p_->at == stage::idle;
}
bool http_reader::head_done() const noexcept {
    return p_->at == stage::body || p_->at == stage::done;
}
bool http_reader::body_streams() const noexcept {
    return p_->streams && head_done();
}
bool http_reader::ready() const noexcept {
    return p_->at == stage::done;
}
bool http_reader::failed() const noexcept {
    return p_->at == stage::failed;
}
int http_reader::error_status() const noexcept {
    return p_->status;
}
const std::string& http_reader::error_reason() const noexcept {
    return p_->reason;
}
http_request& http_reader::request() noexcept {
    return p_->req;
}
void http_reader::next() {
    p_->reset();
}

}  // namespace ordo::gw
