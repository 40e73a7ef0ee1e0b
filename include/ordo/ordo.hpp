// Everything ordo offers, in one include.
#pragma once

#include "ordo/config.hpp"

#include "ordo/address.hpp"
#include "ordo/batch.hpp"
#include "ordo/batched_comm.hpp"
#include "ordo/call.hpp"
#include "ordo/channel.hpp"
#include "ordo/channel_impl.hpp"
#include "ordo/codec.hpp"
#include "ordo/connect.hpp"
#include "ordo/error.hpp"
#include "ordo/handlers.hpp"
#include "ordo/interface.hpp"
#include "ordo/limits.hpp"
#include "ordo/net.hpp"
#include "ordo/peer.hpp"
#include "ordo/pool.hpp"
#include "ordo/router.hpp"
#include "ordo/run.hpp"
#include "ordo/server.hpp"
#include "ordo/transport.hpp"
