// The answer of HAProxy's agent check: the server's weight in percent, from the pool's load, or
// "drain". Pure functions of a PoolLoad, so they are unit-tested with made-up numbers; the
// listener that serves them is AgentCheckServer.
#pragma once

#include <string>

#include "pool/pipeline_pool.h"

namespace qpool::api {

// Note [Agent weight]
// A balancer that sees only its own connections cannot see what else keeps a server busy
// (clients that call it directly, other balancers, loads, a GPU full of pipelines), so the
// server tells it, as a weight in percent of the weight configured for it there:
//   backlog   b = 1 / (1 + t), t = max(in_flight, device_tasks) / serving_devices: requests per
//                 serving device's worker. A new request waits about t runs and then takes
//                 one, so it finishes in about (1 + t) runs: the share of new work the server
//                 should get goes as its inverse (idle: 1, one request per worker: 1/2).
//   admission q = 1 - in_flight / queue_capacity: the room left before limits.max_queue refuses
//                 requests with RESOURCE_EXHAUSTED (1 with no capacity to speak of).
//   memory    m = 1/2 + 1/2 * (budget - allocated) / budget, over every GPU (1 without GPUs).
//                 A GPU filled with resident pipelines serves them well, so a full budget
//                 halves the weight at most: it only costs loads, scale-outs and large requests.
//   residency r = 1/2 + 1/2 * resident / loaded; 0 with no pipeline loaded. An offloaded
//                 pipeline must be copied back before it runs.
// weight = round(100 * b * q * m * r), kept within [1, 100]. Never 0 for a server that is only
// busy or cold: HAProxy takes a weight of 0 as DRAIN, and a busy server should still get a
// share when every server is busy (weights are relative). Only "drain" stops new traffic: the
// answer while the server is not serving yet (start-up, before its --load pipelines are
// loaded) or drains (Note [Drain] in main.cpp).
//
// Note [Agent answer]
// HAProxy's agent check (configuration.txt of HAProxy 2.6, "agent-check") reads one line of
// words. We answer "up ready 63%": "63%" scales the server's configured weight (configure
// weight 100 so percents map 1:1: with the default weight 1, any percent below 100 rounds to
// 0), "ready" clears a DRAIN that our own earlier answer set (only the agent may revert its own
// actions), and "up" restores an operating state an agent set to DOWN (we never do; it is
// harmless). While not serving we answer "drain": no new connections except persistent ones,
// while the health check keeps the server UP so its requests in flight finish. "maint" would
// stop the health checks and "down" would mark it failed; neither is what a drain is.
// "ready" also cancels an operator's MAINT or DRAIN set on HAProxy's runtime API: disable the
// agent ("disable agent <backend>/<server>") before setting one by hand.

// The weight in percent, [1, 100] (Note [Agent weight]).
int AgentWeightPercent(const PoolLoad& load);

// The line to send: "up ready <weight>%\n", or "drain\n" when `serving` is false or the pool
// drains (Note [Agent answer]).
std::string AgentAnswer(const PoolLoad& load, bool serving);

}  // namespace qpool::api
