// The HTTP library comparison (bench/http_libs.sh): cpp-httplib answering POST /inc with "42\n"
// (it reads the body before the handler); a thread per connection from its pool.
#include <httplib.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
    const int port = argc > 1 ? std::atoi(argv[1]) : 8092;
    httplib::Server svr;
    svr.new_task_queue = [] { return new httplib::ThreadPool(80); };
    svr.Post("/inc", [](const httplib::Request&, httplib::Response& res) {
        res.set_content("42\n", "application/json");
    });
    if (!svr.bind_to_port("127.0.0.1", port)) return 1;
    std::printf("ready\n");
    std::fflush(stdout);
    svr.listen_after_bind();
}
