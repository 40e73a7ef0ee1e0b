// Who is at the other end of a connection, what it presented, and what a server decides about
// it (docs/security.md; docs/protocol.md "Authentication").
#pragma once

#include "ordo/config.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ordo {

/// What a unix:// socket's kernel says about the process at its other end (SO_PEERCRED).
struct unix_credentials {
    std::uint32_t uid = 0;
    std::uint32_t gid = 0;
    std::int32_t pid = 0;
};

/// The other side of one connection (peer::identity()). Filled from the transport when the
/// connection opens and, on a server that authenticates, from its decision.
struct identity {
    /// The remote address, as peer::remote_address().
    std::string address;
    /// Who the server decided the caller is (server_options::authenticate): the token's
    /// subject, or the certificate's, or whatever the hook said. Empty where nothing
    /// authenticated the caller.
    std::string subject;
    /// tls:// with a client certificate that chained to the server's CA: its subject (RFC 2253,
    /// "CN=alice,O=example"), its subject alternative names ("DNS:host", "URI:spiffe://...",
    /// "email:a@b", "IP:127.0.0.1"), and the hex SHA-256 of its DER encoding.
    std::string cert_subject;
    std::vector<std::string> cert_sans;
    std::string cert_sha256;
    /// unix:// only.
    std::optional<unix_credentials> unix_peer;
    /// The subject of the token the caller presented (ordo.auth), once the server accepted it.
    std::string token_subject;
    /// Whether the reserved ordo.stats and ordo.methods answer this caller: always where the
    /// server does not authenticate; else as server_options::allow_introspection says.
    bool may_introspect = true;

    /// What a resumed session must present again: the certificate, the subject the server
    /// accepted, and a unix peer's user.
    std::string resume_key() const {
        return cert_sha256 + "\n" + subject + "\n" +
               (unix_peer ? std::to_string(unix_peer->uid) : std::string());
    }
    /// The subject if there is one, else the address: how messages name the caller.
    const std::string& name() const noexcept { return subject.empty() ? address : subject; }
};

/// What a caller presents in its ordo.auth message, once per connection, before its first call
/// (peer_options::credentials; the URL parameter token_file=PATH).
struct credentials {
    std::string token;
    bool empty() const noexcept { return token.empty(); }
};

/// A server's decision on a new connection (server_options::authenticate).
struct auth_verdict {
    bool accepted = false;
    std::string subject;  ///< accepted: who the caller is (identity::subject)
    std::string reason;   ///< refused: why, as the caller's error says it
    static auth_verdict accept(std::string subject) { return {true, std::move(subject), {}}; }
    static auth_verdict refuse(std::string reason) { return {false, {}, std::move(reason)}; }
};

/// Decides on a connection from what its transport proved (`who`: certificate, unix
/// credentials, address) and what the caller presented (`presented`: empty if it sent no
/// ordo.auth). Runs on the connection's loop, once per connection, before any of its messages
/// is served; must not block.
using authenticate_fn = std::function<auth_verdict(const identity& who, const credentials& presented)>;

/// A rule on callers (handler_options::allow, server_options::allow_introspection).
using allow_fn = std::function<bool(const identity& who)>;

/// A rule that lets in the callers whose identity::subject is one of `subjects`.
allow_fn allow_subjects(std::vector<std::string> subjects);

/// Reads a token file: one `TOKEN SUBJECT` per line; blank lines and lines starting with `#`
/// are skipped. Throws std::system_error (errc::bad_address) naming the file and line for
/// what it cannot read: a missing subject, a token shorter than 16 characters, a token given
/// twice, a file over 1 MiB, a file with no token at all, and (as ssh refuses a private key
/// others can read) a regular file whose mode lets group or others read or write it.
std::map<std::string, std::string> read_token_file(const std::string& path);

/// An authenticate_fn over a table of tokens (token -> subject): a caller that presents a
/// known token is accepted as its subject. One that presents none is accepted as its verified
/// client certificate's subject when it has one (tls:// with a CA), and refused otherwise. An
/// unknown token is refused, whatever the certificate. Tokens are compared in constant time.
authenticate_fn authenticate_tokens(std::map<std::string, std::string> tokens);

/// The first line of `path`, without its line end: a caller's token file (token_file=PATH).
/// Throws std::system_error (errc::bad_address) naming the file if it cannot be read, is empty,
/// or is a regular file that group or others may read or write (chmod 600).
std::string read_token(const std::string& path);

}  // namespace ordo
