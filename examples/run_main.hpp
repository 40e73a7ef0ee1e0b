// Runs a program's coroutine on a fresh io_context: what `main` does in every example here.
#pragma once

#include <exception>
#include <iostream>

#include <ordo/net.hpp>

/// Runs `body` to completion. An exception is printed as `<prefix><what>` on stderr and makes the
/// exit status 1.
inline int run_main(const char* prefix, ordo::net::awaitable<void> body) {
    ordo::net::io_context io;
    int status = 0;
    ordo::net::co_spawn(io, std::move(body), [&](std::exception_ptr e) {
        if (!e) return;
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& ex) {
            std::cerr << prefix << ex.what() << "\n";
            status = 1;
        }
    });
    io.run();
    return status;
}
