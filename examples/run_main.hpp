// Runs a program's coroutine on a fresh io_context: what `main` does in every example here.
#pragma once

#include <exception>
#include <iostream>

#include <ordo/run.hpp>

/// Runs `body` to completion. An exception is printed as `<prefix><what>` on stderr and makes the
/// exit status 1.
inline int run_main(const char* prefix, ordo::net::awaitable<void> body) {
    try {
        ordo::run(std::move(body));
        return 0;
    } catch (const std::exception& ex) {
        std::cerr << prefix << ex.what() << "\n";
        return 1;
    }
}
