// The HTTP library comparison (bench/http_libs.sh): civetweb answering POST /inc with "42\n",
// reading the body first, one worker thread per connection (as ordo gateway runs it).
#include <civetweb.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

static int handle(mg_connection* c, void*) {
    char buf[4096];
    while (mg_read(c, buf, sizeof buf) > 0) {
    }
    static const char reply[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 3\r\n\r\n42\n";
    mg_write(c, reply, sizeof reply - 1);
    return 200;
}

int main(int argc, char** argv) {
    const std::string port = argc > 1 ? argv[1] : "8090";
    const char* opts[] = {"listening_ports", port.c_str(), "num_threads", "80", "enable_keep_alive",
                          "yes", "tcp_nodelay", "1", nullptr};
    mg_init_library(0);
    mg_callbacks cb{};
    mg_context* ctx = mg_start(&cb, nullptr, opts);
    if (!ctx) return 1;
    mg_set_request_handler(ctx, "/", handle, nullptr);
    std::printf("ready\n");
    std::fflush(stdout);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGINT);
    sigprocmask(SIG_BLOCK, &s, nullptr);
    int sig;
    sigwait(&s, &sig);
    mg_stop(ctx);
}
