// The interface served by ordo-inc-server and called by ordo-inc-client and examples/inc.cpp.
#pragma once

#include <string>

#include <ordo/ordo.hpp>

struct counter : ordo::interface {
    ordo::method<int(int)> inc{"inc"};             // x + 1
    ordo::method<long(int)> add{"add"};            // adds to the server's total, returns it
    ordo::method<long()> total{"total"};           // the server's total
    ordo::method<int(int)> sleep_ms{"sleep_ms"};   // suspends that long, returns its argument
    ordo::method<void(std::string)> fail{"fail"};  // answers an error with that message
    ordo::method<ordo::stream<int>(int)> count_to{"count_to"};  // streams 0 .. n-1
    // The same, from a streaming batch handler: callers are batched, each gets 0 .. n-1.
    ordo::method<ordo::stream<int>(int)> count_batch{"count_batch"};
    // Streams both ways (docs/protocol.md): the sum of the items written; each item times k.
    ordo::method<ordo::upload<long, long>()> sum{"sum"};
    ordo::method<ordo::two_way<long, long>(long)> scale{"scale"};
};
