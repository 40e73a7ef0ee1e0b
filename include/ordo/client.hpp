// What a call site needs, and no more: typed interfaces and their stubs, channels, calls,
// one-way messages, streams, ordo::async_connect and ordo::run. About half the compile time of
// <ordo/ordo.hpp> for a hello world: no server, handlers, batching or transports, and of
// msgpack-c only the common adaptors (ordo/rpc/detail/msgpack_core.hpp says which; include
// <msgpack.hpp> for the rest, e.g. MSGPACK_DEFINE structs).
//
//   #include <ordo/client.hpp>
//   struct counter : ordo::interface { ordo::method<int(int)> inc{"inc"}; };
//   ordo::channel ch = co_await ordo::async_connect("tcp://127.0.0.1:7000");
//   int v = co_await ordo::stub<counter>(ch).inc(1);
#pragma once

#include "ordo/config.hpp"

#include "ordo/rpc/call.hpp"
#include "ordo/rpc/channel.hpp"
#include "ordo/rpc/connect.hpp"
#include "ordo/rpc/context.hpp"
#include "ordo/error.hpp"
#include "ordo/rpc/interface.hpp"
#include "ordo/net.hpp"
#include "ordo/run.hpp"
