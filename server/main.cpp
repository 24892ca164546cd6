// qpool-server: serves the pipelines of a model repository over gRPC.
#include <ATen/Parallel.h>
#include <signal.h>
#include <sys/resource.h>
#include <torch/version.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <iostream>
#include <optional>
#include <thread>

#include "api/agent_check_server.h"
#include "api/agent_weight.h"
#include "api/grpc_server.h"
#include "api/http/http_api_server.h"
#include "component/attention_backend.h"
#include "config/model_repository.h"
#include "config/server_options.h"
#include "memory/arena_allocator.h"
#include "memory/device_memory.h"
#include "memory/driver_memory.h"
#include "memory/memory_event_log.h"
#include "memory/memory_metrics.h"
#include "metrics/metrics_http_server.h"
#include "metrics/metrics_registry.h"
#include "pipeline/pipeline_kinds.h"
#include "pool/batch_profiler.h"
#include "pool/device_pool.h"
#include "pool/pipeline_pool.h"
#include "residency/block_copy.h"
#include "util/clock.h"
#include "util/host_memory.h"
#include "util/log.h"
#include "util/tls_files.h"

namespace {

// Note [Drain]
// On SIGTERM/SIGINT the server drains, within --drain-seconds (default 25 s, inside Kubernetes'
// default 30 s grace period):
//   0. With --drain-notice-seconds N, the first N s are a notice: health goes NOT_SERVING and
//      the agent (--agent-listen) answers "drain" at once, but new requests are still served.
//      Balancers poll (HAProxy's agent every agent-inter, readiness probes every period), so a
//      request sent just before they noticed would otherwise be refused; with a notice longer
//      than their polling interval no request routed by them is refused.
//   1. health (grpc.health.v1: "" and each service) goes NOT_SERVING and new Generate/Encode
//      calls get UNAVAILABLE "the server is draining ..." from our own code (RequestRun), while
//      the port stays open. gRPC's Shutdown is not the first step because it closes the listener
//      and sends GOAWAY: a probe or a new call would then see only a refused connection
//      (UNAVAILABLE with a transport message), never NOT_SERVING nor why. With the port open,
//      readiness probes observe NOT_SERVING and clients get a retryable UNAVAILABLE that says
//      what happens. WatchMemory streams, which never end by themselves, end with UNAVAILABLE.
//   2. The requests in flight (queued or running: PipelinePool::InFlight) run until
//      none is left or the time is up.
//   3. gRPC's Shutdown closes the port and waits, until the same deadline, for the calls still
//      open (the last writes of a finished Generate, admin calls), then cancels the rest: a
//      running Generate stops at its next denoising step and frees its memory, a queued one ends
//      when the worker reaches it; its client sees UNAVAILABLE or CANCELLED.
// main then unloads every pipeline (PipelinePool::UnloadAll, which stops the idle offloader
// first), each replica on its device's worker, with the
// usual leak check (the last memory events and logs say what was given back) and exits 0. A
// health Watch stream that a client keeps open holds step 3 until the deadline.

qpool::api::AccessOptions AccessOptionsFor(const qpool::ServerOptions& options) {
  qpool::api::AccessOptions access;
  access.token_file = options.admin_token_file;
  access.allowed_clients = options.admin_clients;
  access.protect = {qpool::api::CallClass::kAdmin};  // always (Note [Admin credentials])
  for (const std::string& name : options.protect) {
    access.protect.insert(name == "admin"       ? qpool::api::CallClass::kAdmin
                          : name == "inference" ? qpool::api::CallClass::kInference
                                                : qpool::api::CallClass::kRead);
  }
  return access;
}

// The OpenAI images API on --http-listen, with gRPC's tokens, --protect classes and certificate.
qpool::StatusOr<std::unique_ptr<qpool::api::http::HttpApiServer>> StartHttpApi(
    const qpool::ServerOptions& options, const qpool::api::AccessOptions& access,
    qpool::PipelinePool& pool, const std::atomic<bool>& serving) {
  qpool::api::http::HttpApiOptions http;
  http.token_file = options.admin_token_file;
  http.protect_inference = access.protect.count(qpool::api::CallClass::kInference) != 0;
  http.protect_read = access.protect.count(qpool::api::CallClass::kRead) != 0;
  if (!options.tls_cert.empty()) {
    ASSIGN_OR_RETURN(std::string cert, qpool::ReadSmallFile(options.tls_cert));
    ASSIGN_OR_RETURN(std::string key, qpool::ReadSmallFile(options.tls_key));
    http.tls = std::make_pair(std::move(cert), std::move(key));
  }
  http.ready = [&serving] { return serving.load(); };
  return qpool::api::http::HttpApiServer::Start(options.http_listen, pool, std::move(http));
}

// The certificate and key for /metrics when it serves HTTPS (--metrics-tls), else nullopt.
qpool::StatusOr<std::optional<qpool::MetricsTls>> MetricsTlsFor(
    const qpool::ServerOptions& options) {
  const bool on =
      options.metrics_tls == "on" || (options.metrics_tls == "auto" && !options.tls_cert.empty() &&
                                      !qpool::IsLoopbackListen(options.metrics_listen));
  if (!on) return std::optional<qpool::MetricsTls>();
  ASSIGN_OR_RETURN(auto info, qpool::CheckCertificateAndKey(options.tls_cert, options.tls_key));
  qpool::MetricsTls tls;
  ASSIGN_OR_RETURN(tls.cert_pem, qpool::ReadSmallFile(options.tls_cert));
  ASSIGN_OR_RETURN(tls.key_pem, qpool::ReadSmallFile(options.tls_key));
  qpool::log::Info("/metrics over HTTPS with ", info.subject);
  return std::optional<qpool::MetricsTls>(std::move(tls));
}

// Says what is open to whom when the server listens beyond loopback.
void WarnAboutExposure(const qpool::ServerOptions& options,
                       const qpool::api::AccessOptions& access) {
  if (qpool::IsLoopbackListen(options.listen)) return;
  if (options.tls_cert.empty()) {
    qpool::log::Warn("gRPC on ", options.listen,
                     " is plaintext: anyone on the network can read prompts and images",
                     options.admin_token_file.empty() ? "" : " and the admin bearer tokens",
                     " (--tls-cert, --tls-key; docs/security.md)");
  }
  if (access.token_file.empty() && access.allowed_clients.empty()) {
    qpool::log::Error("UNPROTECTED: admin calls (load, unload, offload, move, ...) on ",
                      options.listen,
                      " are open to every client that can reach it: set --admin-token-file or "
                      "--admin-clients, or listen on loopback (docs/security.md)");
  }
}

// Steps 0 to 3 of Note [Drain]. `serving` is what the agent check reports.
void Drain(qpool::api::GrpcServer& server, qpool::PipelinePool& pool, std::atomic<bool>& serving,
           int drain_seconds, int notice_seconds) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(drain_seconds);
  // The same instant on the clock gRPC takes (steady time cannot jump while we wait).
  const auto grpc_deadline = std::chrono::system_clock::now() + std::chrono::seconds(drain_seconds);
  serving = false;
  if (notice_seconds > 0) {
    server.SetServing(false);
    qpool::log::Info(
        "drain notice: health NOT_SERVING, agent answers drain; new requests are "
        "still served for ",
        notice_seconds, " s");
    std::this_thread::sleep_until(start + std::chrono::seconds(notice_seconds));
  }
  pool.BeginDrain();
  server.SetServing(false);
  int left = pool.InFlight();
  qpool::log::Info("draining: health NOT_SERVING, new requests refused; ", left,
                   " request(s) in flight get up to ", drain_seconds, " s");
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    left = pool.InFlight();
  }
  if (left > 0) {
    qpool::log::Warn("drain time is up: cancelling ", left, " request(s) still in flight");
  } else {
    qpool::log::Info("drained: no request in flight after ", qpool::SecondsSince(start), " s");
  }
  server.Shutdown(grpc_deadline);
  qpool::log::Info("gRPC server stopped ", qpool::SecondsSince(start), " s after the signal");
}

// Note [Signals]
// SIGTERM and SIGINT drain (Note [Drain]); they are blocked before anything else runs, so that
// one arriving during start-up is taken by sigwait, never by the default action: during the
// start-up loads it stops them after the one in progress, and the drain follows with what is
// loaded. SIGHUP and SIGUSR1 are logged and ignored (token, certificate and manifest files are
// re-read as they change, so there is nothing to reload), rather than killing the server without
// a drain. SIGPIPE is ignored: a closed stdout or socket is an error where it is written, not the
// end of the process (`qpool-server ... | head` once killed it at start-up).
sigset_t BlockServerSignals() {
  signal(SIGPIPE, SIG_IGN);
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// True if a SIGTERM or SIGINT is waiting for sigwait.
bool StopRequested() {
  sigset_t pending;
  sigemptyset(&pending);
  return sigpending(&pending) == 0 &&
         (sigismember(&pending, SIGTERM) == 1 || sigismember(&pending, SIGINT) == 1);
}

// Waits for SIGTERM or SIGINT (Note [Signals]), logging the others; returns its number.
int WaitForStop(const sigset_t& signals) {
  for (;;) {
    int signal_number = 0;
    if (sigwait(&signals, &signal_number) != 0) continue;
    if (signal_number == SIGTERM || signal_number == SIGINT) return signal_number;
    qpool::log::Info(signal_number == SIGHUP ? "SIGHUP" : "SIGUSR1",
                     " ignored: files are re-read as they change; SIGTERM drains and stops");
  }
}

// Raises the soft limit on open files to the hard one: each HTTP or gRPC connection is a
// descriptor, and a soft limit of 1024 (many systems' default) would refuse clients long before
// the HTTP port's own limit (HttpApiServer::kConnectionLimit).
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t was = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
    qpool::log::Info("open file limit raised from ", was, " to ", limit.rlim_cur);
  }
}

int Run(int argc, char** argv) {
  // Every thread started below inherits the mask; signals are taken by sigwait in this thread.
  const sigset_t signals = BlockServerSignals();
  auto options = qpool::ParseServerOptions(argc, argv, QPOOL_VERSION);
  if (!options.ok()) {
    if (options.status().code() == qpool::StatusCode::kCancelled) {
      std::cout << options.status().message();
      return 0;
    }
    std::cerr << "qpool-server: " << options.status().message() << "\n";
    return 2;
  }
  qpool::log::SetLevel(options->log_level);
  RaiseOpenFileLimit();
  if (const qpool::Status profiling = qpool::BatchProfiler::Configure(
          {options->profile_dir, options->profile_skip, options->profile_batches});
      !profiling.ok()) {
    std::cerr << "qpool-server: " << profiling.message() << "\n";
    return 2;
  }
  if (options->cpu_threads > 0) at::set_num_threads(options->cpu_threads);

  const auto kinds = qpool::PipelineKinds::Builtin();
  auto repository = qpool::ModelRepository::Open(options->model_repository, kinds->Catalog());
  if (!repository.ok()) {
    std::cerr << "qpool-server: " << repository.status().message() << "\n";
    return 2;
  }
  qpool::DevicePoolOptions device_options;
  device_options.default_device = options->device;
  device_options.max_queue = static_cast<size_t>(options->max_queue);
  auto devices = qpool::DevicePool::Create(device_options);
  if (!devices.ok()) {
    std::cerr << "qpool-server: " << devices.status().message() << "\n";
    return 2;
  }
  // ATen settles its attention order on a GPU of the pool's (Note [Attention backend]).
  int attention_device = -1;
  for (const c10::Device& d : (*devices)->devices()) {
    if (d.is_cuda()) {
      attention_device = d.index();
      break;
    }
  }
  auto attention = qpool::ApplyAttentionBackend(options->attention, attention_device);
  if (!attention.ok()) {
    std::cerr << "qpool-server: --attention: " << attention.status().message() << "\n";
    return 2;
  }
  qpool::log::Info("attention kernels in this order, the first that fits each call: ",
                   qpool::DescribeAttentionPriority(*attention));
  qpool::ArenaAllocator arenas;
  qpool::BlockCopier copier;
  const std::unique_ptr<qpool::DriverMemory> driver = qpool::DriverMemory::Open();
  qpool::DeviceMemory memory(arenas, driver.get());
  memory.MeasureContexts((*devices)->devices());
  qpool::MemoryEventLog events;
  qpool::ResidencyContext residency{&arenas, &copier, &memory, &events};
  qpool::AdmissionOptions admission;
  admission.memory_budget = options->memory_budget;
  admission.host_budget_bytes =
      options->host_memory_budget_bytes > 0
          ? options->host_memory_budget_bytes
          : static_cast<uint64_t>(options->host_memory_budget *
                                  static_cast<double>(qpool::HostMemoryBytes()));
  qpool::log::Info("host memory budget: ", admission.host_budget_bytes, " bytes");
  qpool::MetricsRegistry metrics;
  metrics.AddGauge("qpool_build_info", "qpool build; the value is 1.", {"version", "torch"})
      .WithLabels({QPOOL_VERSION, TORCH_VERSION})
      .Set(1);
  qpool::MemoryMetrics memory_metrics(metrics, memory, events, (*devices)->devices());
  qpool::PoolOptions pool_options;
  pool_options.admission = admission;
  pool_options.load_on_demand = options->load_on_demand;
  qpool::PipelinePool pool(*repository, kinds, **devices, residency, &metrics, pool_options);
  std::unique_ptr<qpool::MetricsHttpServer> metrics_server;
  if (!options->metrics_listen.empty()) {
    auto tls = MetricsTlsFor(*options);
    if (!tls.ok()) {
      std::cerr << "qpool-server: " << tls.status().message() << "\n";
      return 2;
    }
    auto started = qpool::MetricsHttpServer::Start(options->metrics_listen, metrics, *tls);
    if (!started.ok()) {
      std::cerr << "qpool-server: " << started.status().message() << "\n";
      return 1;
    }
    metrics_server = std::move(started).value();
  }
  // What the agent check reports: "drain" until the server serves and once it drains.
  std::atomic<bool> serving{false};
  std::unique_ptr<qpool::api::AgentCheckServer> agent_server;
  if (!options->agent_listen.empty()) {
    auto started = qpool::api::AgentCheckServer::Start(options->agent_listen, [&pool, &serving] {
      return qpool::api::AgentAnswer(pool.CurrentLoad(), serving.load());
    });
    if (!started.ok()) {
      std::cerr << "qpool-server: " << started.status().message() << "\n";
      // As for gRPC: a port in use is the environment's, a malformed address the flag's.
      return started.status().code() == qpool::StatusCode::kUnavailable ? 1 : 2;
    }
    agent_server = std::move(started).value();
  }

  qpool::api::GrpcServerOptions grpc_options;
  grpc_options.listen = options->listen;
  grpc_options.max_message_bytes = options->max_message_mb << 20;
  grpc_options.max_watchers = static_cast<size_t>(options->max_watchers);
  grpc_options.tls.cert_file = options->tls_cert;
  grpc_options.tls.key_file = options->tls_key;
  grpc_options.tls.client_ca_file = options->tls_client_ca;
  grpc_options.tls.reload_seconds = static_cast<unsigned>(options->tls_reload_seconds);
  grpc_options.access = AccessOptionsFor(*options);
  grpc_options.metrics = &metrics;
  auto server = qpool::api::GrpcServer::Start(grpc_options, pool);
  if (!server.ok()) {
    std::cerr << "qpool-server: " << server.status().message() << "\n";
    // A port in use is the environment's; anything else (TLS files, credentials) is the flags'.
    return server.status().code() == qpool::StatusCode::kUnavailable ? 1 : 2;
  }
  WarnAboutExposure(*options, grpc_options.access);
  std::unique_ptr<qpool::api::http::HttpApiServer> http_server;
  if (!options->http_listen.empty()) {
    auto started = StartHttpApi(*options, grpc_options.access, pool, serving);
    if (!started.ok()) {
      std::cerr << "qpool-server: " << started.status().message() << "\n";
      return started.status().code() == qpool::StatusCode::kUnavailable ? 1 : 2;
    }
    http_server = std::move(started).value();
  }
  pool.LoadAtStartup(options->load, StopRequested);
  (*server)->SetServing(true);
  serving = true;
  if (metrics_server) {
    std::cout << "qpool-server metrics on " << metrics_server->address() << std::endl;
  }
  if (agent_server) {
    std::cout << "qpool-server agent on " << agent_server->address() << std::endl;
  }
  if (http_server) std::cout << "qpool-server http on " << http_server->address() << std::endl;
  std::cout << "qpool-server listening on " << (*server)->address() << std::endl;
  qpool::log::Info("serving model repository ", repository->root(), " on ", (*server)->address());

  const int signal_number = WaitForStop(signals);
  qpool::log::Info(signal_number == SIGTERM ? "SIGTERM" : "SIGINT", ": shutting down");
  Drain(**server, pool, serving, options->drain_seconds, options->drain_notice_seconds);
  if (http_server) http_server->Stop();
  pool.UnloadAll();
  (*devices)->Stop();
  if (agent_server) agent_server->Stop();
  if (metrics_server) metrics_server->Stop();
  qpool::log::Info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
