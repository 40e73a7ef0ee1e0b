// The completion of coroutines that ordo spawns with no one to await them.
#pragma once

#include <exception>

namespace ordo::detail {

/// Instead of Asio's `detached` token, which swallows what escapes: an exception that escapes
/// such a coroutine is a bug in ordo (they catch what their work may throw), so it is rethrown
/// from the io_context's run(), where the application sees it, as Asio does for a throwing
/// handler.
struct rethrow_escaped {
    void operator()(std::exception_ptr e) const {
        if (e) std::rethrow_exception(e);
    }
};

}  // namespace ordo::detail
