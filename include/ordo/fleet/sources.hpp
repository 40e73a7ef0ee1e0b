// Where a router's replicas come from (docs/router-and-fleets.md, "Running a fleet"): DNS (A/AAAA
// and SRV), a file, etcd v3; and the server side of etcd, a registration that keeps a replica
// listed while it runs.
#pragma once

#include "ordo/config.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ordo/net.hpp"

namespace ordo {

/// One replica as a source lists it.
struct member {
    std::string url;  ///< a full ordo URL, e.g. tcp://10.0.0.2:7000
    double weight = 1;
    std::string group;
    bool operator==(const member&) const = default;
};

/// What a source has done so far.
struct source_counters {
    std::uint64_t refreshes = 0;  ///< lookups that gave a set
    std::uint64_t failures = 0;   ///< lookups that failed; the last good set stayed
    std::uint64_t rejected = 0;   ///< entries left out of a set (a line or key ordo cannot use)
    std::string last_error;       ///< why the last lookup failed or entry was left out ("" if none)
    std::size_t members = 0;      ///< size of the last good set
};

/// A source of replicas for a router (router::follow). Belongs to the executor given at its
/// creation: every member runs there, and so do its callbacks. Needs no thread of its own.
class replica_source {
  public:
    virtual ~replica_source() = default;
    /// Starts looking. `update` gets the whole set when it is first known and each time it
    /// changes, never an empty one: an empty answer is a failed lookup. `problem` gets a line
    /// for each failed lookup and each entry left out of a set; the router then keeps serving
    /// the last good set.
    virtual void start(std::function<void(std::vector<member>)> update,
                       std::function<void(const std::string&)> problem) = 0;
    /// A replica was lost: look again soon (each source limits how often).
    virtual void refresh_now() = 0;
    /// Stops looking: no callback runs after it returns.
    virtual void stop() = 0;
    /// What it watches, e.g. "dns:_ordo._tcp.svc.test (nameserver 127.0.0.1:5353)".
    virtual std::string describe() const = 0;
    virtual source_counters counters() const = 0;
    /// Whether its members are what the route's own name resolves to (DNS), so that a route
    /// presents its credentials to them as to the hosts of its URL; a source that reads names
    /// from elsewhere (a file, etcd) does not (router_options::token_hosts).
    virtual bool resolves_own_name() const { return false; }
};

struct dns_source_options {
    /// A host name, looked up as A and AAAA records (`port` then applies), or an SRV name
    /// (it starts with '_': `_service._proto.name`), whose records carry port and weight.
    std::string name;
    std::uint16_t port = 0;
    /// Replica URLs are `scheme://address:port` plus `url_suffix` (e.g. "?cert=...").
    std::string scheme = "tcp";
    std::string url_suffix;
    /// "ip", "ip:port" or "[ipv6]:port"; empty: the system's (/etc/resolv.conf).
    std::string nameserver;
    /// Looks again this often, and on refresh_now() at most once per `min_refresh`.
    std::chrono::milliseconds refresh{5'000};
    std::chrono::milliseconds min_refresh{500};
    /// One lookup may take this long (c-ares retries within it).
    std::chrono::milliseconds timeout{2'000};
};
std::unique_ptr<replica_source> make_dns_source(net::any_io_executor ex, dns_source_options o);

struct file_source_options {
    /// One replica a line: `URL [weight=W] [group=G]`; blank lines and `#` comments are skipped.
    std::string path;
    /// Appended to each URL that has no '?' of its own (the route URL's transport parameters).
    std::string url_suffix;
    /// Checked for changes this often (a changed file is re-read at once when inotify says so).
    std::chrono::milliseconds poll{1'000};
};
std::unique_ptr<replica_source> make_file_source(net::any_io_executor ex, file_source_options o);

/// How ordo reaches etcd over https://, and who it is there (etcd_source_options::access,
/// etcd_registration_options::access).
struct etcd_access {
    /// https://: trust this CA (PEM); empty: the system's CAs.
    std::string ca_file;
    /// A client certificate and key (PEM), for an etcd that checks them (--client-cert-auth).
    std::string cert_file, key_file;
    /// etcd's authentication: a user and password, exchanged for a token
    /// (/v3/auth/authenticate), again whenever etcd says the token is no longer valid.
    std::string user, password;
    /// Or a token etcd gave, sent as it is (Authorization).
    std::string token;
};

struct etcd_source_options {
    /// etcd's client URL, e.g. "http://127.0.0.1:2379" or "https://..." (its v3 JSON gateway).
    std::string endpoint;
    etcd_access access;
    /// Replicas are the keys `prefix + url`; a key's value is empty or JSON
    /// `{"weight": 2, "group": "canary"}`.
    std::string prefix;
    /// Appended to each URL that has no '?' of its own.
    std::string url_suffix;
    /// One request to etcd may take this long; an unreachable etcd is tried again after `retry`.
    std::chrono::milliseconds timeout{2'000};
    std::chrono::milliseconds retry{1'000};
    /// The whole set is read again this often, and the watch started over from there. This
    /// catches a watch gone silent, which a hung or cut-off etcd leaves open with no error:
    /// the re-read then times out and is reported. 0: only the watch.
    std::chrono::milliseconds reread{30'000};
};
std::unique_ptr<replica_source> make_etcd_source(net::any_io_executor ex, etcd_source_options o);

struct etcd_registration_options {
    std::string endpoint;  ///< as in etcd_source_options
    etcd_access access;
    std::string prefix;
    std::string url;  ///< what callers connect to; the key is prefix + url
    double weight = 1;
    std::string group;
    /// The lease's time to live: a replica that dies without revoking it leaves the set this
    /// long after its last keep-alive. Kept alive every ttl / 3.
    std::chrono::seconds ttl{10};
    std::chrono::milliseconds timeout{2'000};
    /// Called on the executor with a line when a keep-alive fails or the key is put again.
    std::function<void(const std::string&)> on_event;
};

/// The server side of etcd membership: puts `prefix + url` under a lease and keeps the lease
/// alive while it runs; if etcd forgot the lease (it restarted, or keep-alives failed for longer
/// than the ttl) it grants a new one and puts the key again. Belongs to its executor.
class etcd_registration {
  public:
    etcd_registration(net::any_io_executor ex, etcd_registration_options o);
    /// Stops keeping the lease alive, without revoking it (the key leaves after the ttl).
    ~etcd_registration();
    etcd_registration(const etcd_registration&) = delete;
    etcd_registration& operator=(const etcd_registration&) = delete;

    /// Grants the lease and puts the key. Throws std::system_error naming the endpoint and the
    /// reason if etcd cannot be reached or refuses.
    net::awaitable<void> async_start();
    /// Revokes the lease, which deletes the key at once (a graceful stop).
    net::awaitable<void> async_stop();

    struct state;

  private:
    std::shared_ptr<state> s_;
};

}  // namespace ordo
