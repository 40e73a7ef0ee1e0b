// dnsmasq (Debian's dnsmasq-base) for tests: on 127.0.0.1 and a free UDP port, authoritative for
// *.test, started, restarted and killed by PID only; and a raw DNS query to see that it answers.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/processes.hpp"

namespace ordo::test {

using namespace std::chrono_literals;

// A DNS query for `name` (type `qtype`, class IN) with id `id`.
inline std::string dns_query(std::uint16_t id, const std::string& name, std::uint16_t qtype) {
    std::string q{char(id >> 8), char(id & 0xff), 1, 0, 0, 1, 0, 0, 0, 0, 0, 0};
    for (std::size_t at = 0; at <= name.size();) {
        auto dot = name.find('.', at);
        if (dot == std::string::npos) dot = name.size();
        q += char(dot - at);
        q += name.substr(at, dot - at);
        at = dot + 1;
    }
    q += std::string{0, char(qtype >> 8), char(qtype & 0xff), 0, 1};
    return q;
}

// Whether a DNS server on 127.0.0.1:port answers a query within `limit` (raw UDP, no resolver).
inline bool dns_answers(std::uint16_t port, std::chrono::milliseconds limit) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const std::string q = dns_query(0x4242, "probe.test", 1);
    bool ok = false;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!ok && std::chrono::steady_clock::now() < deadline) {
        ::sendto(fd, q.data(), q.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 100) > 0) {
            unsigned char buf[512];
            const auto n = ::recv(fd, buf, sizeof buf, 0);
            ok = n >= 12 && buf[0] == 0x42 && buf[1] == 0x42;
        }
    }
    ::close(fd);
    return ok;
}

// A free UDP port on 127.0.0.1 (free when asked; dnsmasq may still lose it to another process,
// which start() notices and retries).
inline std::uint16_t free_udp_port() {
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

// dnsmasq on 127.0.0.1:port, authoritative for *.test: A/AAAA records from a hosts file (changed
// with set_hosts(), which makes dnsmasq read it again), SRV records from its command line
// (changed by a restart on the same port).
class dnsmasq {
  public:
    dnsmasq() {
        char tmpl[] = "/tmp/ordo-dns-test-XXXXXX";
        if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
        dir_ = tmpl;
    }
    ~dnsmasq() {
        proc_.reset();
        std::filesystem::remove_all(dir_);
    }

    // Writes the hosts file ("ip name" lines); a running dnsmasq reads it again (SIGHUP).
    void set_hosts(const std::string& lines) {
        std::ofstream(dir_ + "/hosts.new") << lines;
        std::filesystem::rename(dir_ + "/hosts.new", dir_ + "/hosts");
        if (proc_) proc_->signal(SIGHUP);
    }

    // Starts (or restarts) it with `srv` records ("name,target,port,priority,weight"), on the
    // port it had if it had one. Returns once it answers queries.
    void start(std::vector<std::string> srv = {}) {
        proc_.reset();
        const bool restart = port_ != 0;  // a restart keeps the port: sources point at it
        for (int attempt = 0; attempt < (restart ? 1 : 5); ++attempt) {
            if (!restart) port_ = free_udp_port();
            std::vector<std::string> argv{path(),
                                          "--keep-in-foreground",
                                          "--conf-file=/dev/null",
                                          "--port=" + std::to_string(port_),
                                          "--listen-address=127.0.0.1",
                                          "--bind-interfaces",
                                          "--no-resolv",
                                          "--no-hosts",
                                          "--addn-hosts=" + dir_ + "/hosts",
                                          "--local=/test/",
                                          "--pid-file",
                                          "--log-facility=-",
                                          "--local-ttl=0"};
            // As root it would drop to nobody, who cannot read the test's directory.
            if (::geteuid() == 0) argv.push_back("--user=root");
            for (const auto& s : srv) argv.push_back("--srv-host=" + s);
            proc_ = std::make_unique<child>(argv);
            for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;) {
                if (dns_answers(port_, 200ms)) return;
                if (proc_->wait_exit(1ms)) break;  // the port was taken, or it failed
            }
            proc_.reset();
        }
        throw std::runtime_error("dnsmasq did not start on 127.0.0.1:" + std::to_string(port_) +
                                 " (see its lines above)");
    }

    // Kills it (by PID); the port stays the one a restart uses.
    void kill() { proc_.reset(); }

    std::string nameserver() const { return "127.0.0.1:" + std::to_string(port_); }

    static std::string path() {
        const char* p = std::getenv("ORDO_DNSMASQ");
        return p ? p : "/usr/sbin/dnsmasq";
    }

  private:
    std::string dir_;
    std::uint16_t port_ = 0;
    std::unique_ptr<child> proc_;
};

}  // namespace ordo::test
