// Processes that tests start and kill by PID: a child with its stdout on a pipe, and
// ordo-inc-server (path in ORDO_INC_SERVER) on a fresh address.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/streams.hpp"

namespace ordo::test {

// A child process with its stdout on a pipe; killed (SIGCONT, then SIGKILL) and reaped on
// destruction. Only this PID is ever signalled.
class child {
  public:
    explicit child(std::vector<std::string> argv, bool with_stderr = false) {
        int fds[2];
        if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
        pid_ = ::fork();
        if (pid_ == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives a test killed by its timeout
            ::dup2(fds[1], 1);
            if (with_stderr) ::dup2(fds[1], 2);
            ::close(fds[0]);
            ::close(fds[1]);
            std::vector<char*> args;
            for (auto& a : argv) args.push_back(a.data());
            args.push_back(nullptr);
            ::execv(args[0], args.data());
            std::_Exit(127);
        }
        ::close(fds[1]);
        out_ = fds[0];
    }
    ~child() {
        if (pid_ > 0) {
            ::kill(pid_, SIGCONT);
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
        if (out_ >= 0) ::close(out_);
    }
    // The next line of output, waiting at most `limit`.
    std::string read_line(std::chrono::milliseconds limit = std::chrono::seconds(10)) {
        std::string line;
        const auto deadline = std::chrono::steady_clock::now() + limit;
        char c;
        while (std::chrono::steady_clock::now() < deadline) {
            pollfd p{out_, POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;
            if (::read(out_, &c, 1) != 1) break;
            if (c == '\n') return line;
            line += c;
        }
        return line;
    }
    void signal(int sig) { ::kill(pid_, sig); }
    // The exit status once the process has ended within `limit`, or nothing.
    std::optional<int> wait_exit(std::chrono::milliseconds limit) {
        const auto deadline = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < deadline) {
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
            ::usleep(5000);
        }
        return std::nullopt;
    }
    pid_t pid() const { return pid_; }

  private:
    pid_t pid_ = -1;
    int out_ = -1;
};

// ordo-inc-server on a free loopback port (or a fresh path) of `scheme`; returns the URL to
// connect to, from its "listening on" line.
inline std::string start_server(std::unique_ptr<child>& srv, const std::string& extra = "",
                         const std::string& scheme = "tcp") {
    const char* path = std::getenv("ORDO_INC_SERVER");
    if (!path) throw std::runtime_error("ORDO_INC_SERVER is not set (run through meson test)");
    std::vector<std::string> argv{path, "--listen", listen_url(scheme)};
    if (!extra.empty()) {
        argv.push_back("--liveness-timeout-ms");
        argv.push_back(extra);
    }
    srv = std::make_unique<child>(argv);
    const std::string line = srv->read_line();
    const std::string prefix = "listening on ";
    if (line.rfind(prefix, 0) != 0) throw std::runtime_error("server said: " + line);
    return connect_url(line.substr(prefix.size()));
}

}  // namespace ordo::test
