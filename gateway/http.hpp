// HTTP/1.1 requests as the gateway reads them: Node's http_parser (Debian's libhttp-parser) cuts
// the bytes, within the gateway's limits on the head and the body; nothing here does I/O, so
// that the fuzz target (tests/fuzz/http_fuzz.cpp) drives it as a connection would.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ordo::gw {

/// One request, as read.
struct http_request {
    std::string method;  ///< "POST", "GET", ...
    std::string target;  ///< the request-target as sent
    std::string path;    ///< its path, percent-decoded ("/inc")
    std::string query;   ///< what follows '?', as sent (not decoded)
    std::vector<std::pair<std::string, std::string>> headers;  ///< in order, names as sent
    std::string body;
    unsigned short major = 1, minor = 1;
    bool keep_alive = true;  ///< the connection may carry another request after this one

    /// The first header of that name (case aside), or null.
    const std::string* header(std::string_view name) const;
    /// How many headers have that name.
    std::size_t count(std::string_view name) const;
};

/// Percent-decoding: %XX becomes its byte (an invalid escape stays as it is), and, with
/// `plus_is_space` (query strings), '+' a space.
std::string percent_decoded(std::string_view in, bool plus_is_space);

/// Reads requests from a connection's bytes, one at a time: feed() what arrived, until ready()
/// (a whole request) or failed() (a status and a reason to answer before closing: 400 for
/// malformed bytes and ambiguous lengths, 431 for a head over max_head_bytes, 413 for a body
/// over max_body_bytes, announced or sent). After a request, next() starts the one after it
/// (pipelined bytes are fed again: feed() takes nothing past a request's end).
class http_reader {
  public:
    http_reader(std::size_t max_head_bytes, std::size_t max_body_bytes);
    ~http_reader();
    http_reader(const http_reader&) = delete;
    http_reader& operator=(const http_reader&) = delete;

    /// Takes bytes of `in` up to the end of the current request (or an error); returns how
    /// many it took.
    std::size_t feed(std::string_view in);
    /// Nothing of a request has arrived since the last one (an idle keep-alive connection).
    bool idle() const noexcept;
    /// The request line and headers are in (the body may not be).
    bool head_done() const noexcept;
    /// The whole request is in: request() holds it.
    bool ready() const noexcept;
    /// The head is in and the body is NDJSON (Content-Type: application/x-ndjson): its bytes
    /// are taken from request().body as they come (the taker erases whole lines), and
    /// max_body_bytes bounds a line (413 beyond), not the body. The taker feeds at most the room
    /// left, so that an item or two wait here and the rest in the connection (backpressure).
    bool body_streams() const noexcept;
    bool failed() const noexcept;
    int error_status() const noexcept;
    const std::string& error_reason() const noexcept;
    /// The request read (whole once ready(); its head once head_done()).
    http_request& request() noexcept;
    /// Forgets the request read and starts reading the next.
    void next();

    struct impl;

  private:
    std::unique_ptr<impl> p_;
};

}  // namespace ordo::gw
