// Benchmarks run their server in a child process (or, for inproc://, on a thread of their own
// process): start it, let it bind, learn its URL.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "support/streams.hpp"  // listen_url, connect_url: the addresses tests use, per scheme

/// A running benchmark server.
struct bench_server {
    pid_t pid = -1;
    std::thread thread;
    std::shared_ptr<int> thread_status = std::make_shared<int>(1);
    std::string url;  // what the client connects to

    /// Waits for the server to end; true when it ended well (exit status 0).
    bool wait() {
        if (thread.joinable()) {
            thread.join();
            return *thread_status == 0;
        }
        int status = 0;
        if (pid > 0) ::waitpid(pid, &status, 0);
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
};

/// Starts `serve(ready_fd)`, which binds, writes the bound URL and a newline to ready_fd, serves
/// and returns its exit status: in a forked child, or on a thread for inproc.
inline bench_server start_server(const std::string& transport,
                                 const std::function<int(int ready_fd)>& serve) {
    if (transport == "tls") ordo::test::shared_tls_files();  // made before the fork: both use them
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    bench_server s;
    if (transport == "inproc") {
        s.thread = std::thread(
            [status = s.thread_status, serve, fd = fds[1]] { *status = serve(fd); });
    } else {
        s.pid = ::fork();
        if (s.pid == 0) {
            ::close(fds[0]);
            std::_Exit(serve(fds[1]));
        }
        ::close(fds[1]);
    }
    char c;
    while (::read(fds[0], &c, 1) == 1 && c != '\n') s.url += c;
    ::close(fds[0]);
    if (s.url.empty()) throw std::runtime_error("the server did not report its address");
    s.url = ordo::test::connect_url(s.url);
    return s;
}
