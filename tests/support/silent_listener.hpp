// A loopback listener whose accept queue is full: a connection to it neither completes nor
// fails (the kernel drops the SYN, and the client sends it again), until the client gives up.
// Test helper: how a connection attempt that hangs is made without leaving loopback.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <asio/ip/tcp.hpp>

#include "ordo/net.hpp"
#include "support/sleep.hpp"

namespace ordo::test {

class silent_listener {
  public:
    explicit silent_listener(net::any_io_executor ex) : ex_(ex), acc_(ex) {
        acc_.open(net::ip::tcp::v4());
        acc_.bind({net::ip::make_address("127.0.0.1"), 0});
        acc_.listen(0);
    }

    /// Fills the accept queue with connections nobody accepts, until a probe no longer
    /// connects (a bounded number of tries); true once it is full.
    net::awaitable<bool> fill() {
        using namespace std::chrono_literals;
        for (int i = 0; i < 16; ++i) {
            auto s = std::make_unique<net::ip::tcp::socket>(ex_);
            s->async_connect(endpoint(), [](std::error_code) {});
            fill_.push_back(std::move(s));
            co_await sleep_for(200ms);
            // A SYN the kernel takes is answered at once; one it drops is sent again after a
            // second, and dropped again. A second of waiting is ample on a loaded machine.
            net::ip::tcp::socket probe(ex_);
            bool connected = false;
            probe.async_connect(endpoint(), [&](std::error_code ec) { connected = !ec; });
            co_await sleep_for(1000ms);
            probe.close();
            co_await sleep_for(10ms);  // the probe's handler has run
            if (!connected) co_return true;
        }
        co_return false;
    }

    net::ip::tcp::endpoint endpoint() const { return acc_.local_endpoint(); }
    std::string url() const { return "tcp://127.0.0.1:" + std::to_string(endpoint().port()); }

  private:
    net::any_io_executor ex_;
    net::ip::tcp::acceptor acc_;
    std::vector<std::unique_ptr<net::ip::tcp::socket>> fill_;
};

}  // namespace ordo::test
