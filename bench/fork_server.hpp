// Benchmarks run their server in a child process: fork, let it bind, learn its URL.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

/// Forks; the child runs `serve(ready_fd)`, which writes the bound URL and a newline to ready_fd,
/// and exits with its result. Returns the child's PID and the URL.
inline std::pair<pid_t, std::string> fork_server(const std::function<int(int ready_fd)>& serve) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    const pid_t child = ::fork();
    if (child == 0) {
        ::close(fds[0]);
        std::_Exit(serve(fds[1]));
    }
    ::close(fds[1]);
    std::string url;
    char c;
    while (::read(fds[0], &c, 1) == 1 && c != '\n') url += c;
    ::close(fds[0]);
    if (url.empty()) throw std::runtime_error("the server process did not report its address");
    return {child, url};
}
