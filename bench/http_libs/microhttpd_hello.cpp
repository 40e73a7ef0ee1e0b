// The HTTP library comparison (bench/http_libs.sh): libmicrohttpd answering POST /inc with
// "42\n" after reading the body; its internal epoll thread, as many threads as cores.
#include <microhttpd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

static MHD_Result handle(void*, MHD_Connection* c, const char*, const char*, const char*,
                         const char*, size_t* size, void** state) {
    static int marker;
    if (*state == nullptr) {  // headers: wait for the body
        *state = &marker;
        return MHD_YES;
    }
    if (*size != 0) {  // a piece of the body: taken
        *size = 0;
        return MHD_YES;
    }
    static char body[] = "42\n";
    MHD_Response* r = MHD_create_response_from_buffer(3, body, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Content-Type", "application/json");
    const MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

int main(int argc, char** argv) {
    const unsigned port = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 8091;
    MHD_Daemon* d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_TCP_FASTOPEN, static_cast<uint16_t>(port),
        nullptr, nullptr, &handle, nullptr, MHD_OPTION_THREAD_POOL_SIZE, 2u, MHD_OPTION_END);
    if (!d) return 1;
    std::printf("ready\n");
    std::fflush(stdout);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGINT);
    sigprocmask(SIG_BLOCK, &s, nullptr);
    int sig;
    sigwait(&s, &sig);
    MHD_stop_daemon(d);
}
