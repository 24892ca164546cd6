// Command-line options of qpool-server.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace qpool {

struct ServerOptions {
  // Directory of pipeline folders; clients name pipelines, never paths.
  std::string model_repository = "models";
  // host:port; port 0 picks a free one (printed at start-up, for tests and scripts).
  std::string listen = "0.0.0.0:50051";
  // host:port of the Prometheus /metrics endpoint; empty = off. Port 0 picks a free one (printed
  // at start-up as "qpool-server metrics on HOST:PORT").
  std::string metrics_listen;
  // host:port of HAProxy's agent check (api/agent_check_server.h): each connection gets the
  // server's weight ("up ready 63%") or "drain"; empty = off. Port 0 picks a free one (printed
  // at start-up as "qpool-server agent on HOST:PORT").
  std::string agent_listen;
  // host:port of the OpenAI images API over HTTP (api/http/http_api_server.h); empty = off. Port
  // 0 picks a free one (printed at start-up as "qpool-server http on HOST:PORT").
  std::string http_listen;
  // Pipelines loaded at start-up: names, or "all". A failed load is logged, not fatal.
  std::vector<std::string> load;
  // --devices: auto (every GPU, else CPU) | cpu | cuda | cuda:N | cuda:N,cuda:M: where
  // pipelines go unless their manifest or a load names a device.
  std::string device = "auto";
  // Fraction of each GPU's total memory that pipelines plus the running request may use; the
  // rest is left to the CUDA context, the caching allocator's slack and other processes.
  double memory_budget = 0.9;
  // Host memory qpool may fill with pipelines' host copies (Note [Host memory budget] in
  // pool/pipeline_registry.h): bytes when host_memory_budget_bytes > 0, else this fraction of
  // the machine's (or its cgroup's) memory.
  double host_memory_budget = 0.9;
  uint64_t host_memory_budget_bytes = 0;
  // A request for a pipeline of the repository that is not loaded loads it (its manifest's
  // placement), making room under the budgets, instead of FAILED_PRECONDITION.
  bool load_on_demand = false;
  // Requests waiting per device before RESOURCE_EXHAUSTED.
  int max_queue = 64;
  // Largest request/response in MiB: a few 1024x1024 PNGs fit in the default.
  int max_message_mb = 64;
  // Open WatchMemory streams before RESOURCE_EXHAUSTED.
  int max_watchers = 256;
  // Seconds in-flight requests get to finish on SIGTERM/SIGINT (Note [Drain] in main.cpp). 25
  // stays inside Kubernetes' default 30 s grace period, leaving time to unload and exit.
  int drain_seconds = 25;
  // Seconds, at the start of a drain, during which health is NOT_SERVING and the agent says
  // "drain" but new requests are still served, so that balancers that poll (HAProxy's agent
  // check, readiness probes) stop sending before requests are refused (Note [Drain] in
  // main.cpp). Part of drain_seconds, not added to it. 0: refuse at once.
  int drain_notice_seconds = 0;
  // Intra-op threads for CPU work (0 = PyTorch's default, one per core). Several servers or
  // test processes sharing a few cores run far faster with 1 each than oversubscribed.
  int cpu_threads = 0;
  // The attention kernel tried first: auto | flash | cudnn | efficient | math (Note [Attention
  // backend] in component/attention_backend.h, which checks the name at start).
  std::string attention = "auto";
  std::string log_level = "info";
  // Batches recorded with PyTorch's profiler into profile_dir (off when empty): after the first
  // profile_skip, the next profile_batches (Note [Batch profiler] in pool/batch_profiler.h).
  std::string profile_dir;
  int profile_skip = 1;
  int profile_batches = 1;

  // --- TLS and credentials (docs/security.md) ---
  // PEM certificate chain and key: gRPC (and /metrics, see metrics_tls) over TLS. Both or neither.
  std::string tls_cert;
  std::string tls_key;
  // PEM CA bundle: clients must present a certificate it verifies (mTLS). Needs tls_cert.
  std::string tls_client_ca;
  // Seconds between re-reads of the three files (a renewed certificate without a restart).
  int tls_reload_seconds = 60;
  // "auto": /metrics over HTTPS with tls_cert when it listens beyond loopback; "on"; "off".
  std::string metrics_tls = "auto";
  // Bearer tokens that authorize protected calls (Note [Bearer tokens] in util/token_file.h).
  std::string admin_token_file;
  // Client certificate identities (CN or DNS/URI SAN) that authorize protected calls; needs
  // tls_client_ca.
  std::vector<std::string> admin_clients;
  // Call classes that need credentials: "admin", "inference", "read" (Note [Admin credentials]
  // in api/access_control.h). Only meaningful with a credential configured.
  std::vector<std::string> protect = {"admin"};
};

// True when `listen` ("HOST:PORT") names a loopback host: 127.x.y.z, [::1] or localhost.
bool IsLoopbackListen(const std::string& listen);

// Parses argv. Returns InvalidArgument naming the flag; "--help" and "--version" yield kCancelled
// with the usage text, or "qpool-server <version>", as message so the caller can print it and
// exit 0.
StatusOr<ServerOptions> ParseServerOptions(int argc, char** argv,
                                           const std::string& version = "unknown");
// The --help text.
std::string ServerUsage();

}  // namespace qpool
