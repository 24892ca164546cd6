// qpool-server: serves the pipelines of a model repository over gRPC.
#include <signal.h>

#include <cstdio>
#include <future>
#include <iostream>

#include <ATen/Parallel.h>
#include <torch/version.h>

#include "api/grpc_server.h"
#include "api/request_metrics.h"
#include "config/model_repository.h"
#include "config/server_options.h"
#include "memory/arena_allocator.h"
#include "memory/device_memory.h"
#include "memory/memory_event_log.h"
#include "memory/memory_metrics.h"
#include "metrics/metrics_http_server.h"
#include "metrics/metrics_registry.h"
#include "pool/idle_offloader.h"
#include "residency/block_copy.h"
#include "pool/device_pool.h"
#include "pool/pipeline_registry.h"
#include "pool/pool_metrics.h"
#include "util/log.h"

namespace {

// Loads each start-up pipeline (its replicas in turn, each on its device's worker) and waits;
// failures are logged and the pipeline shows as FAILED in ListPipelines, the server still starts.
void LoadAtStartup(const std::vector<std::string>& requested, qpool::PipelineRegistry& registry,
                   qpool::DevicePool& devices, const qpool::ModelRepository& repository) {
  std::vector<std::string> names = requested;
  if (names.size() == 1 && names[0] == "all") names = repository.ListNames();
  for (const auto& name : names) {
    auto planned = registry.PlanLoad(name, "");
    if (!planned.ok()) {
      qpool::log::Error("cannot load '", name, "' at start-up: ", planned.status().message());
      continue;
    }
    std::promise<void> done;
    devices.RunInTurn(
        *planned,
        [&](const c10::Device& device) { return registry.Load(name, device).status(); },
        [&](const qpool::Status&) { done.set_value(); });  // Load logs its own errors
    done.get_future().wait();
  }
}

int Run(int argc, char** argv) {
  auto options = qpool::ParseServerOptions(argc, argv);
  if (!options.ok()) {
    if (options.status().code() == qpool::StatusCode::kCancelled) {
      std::cout << options.status().message();
      return 0;
    }
    std::cerr << "qpool-server: " << options.status().message() << "\n";
    return 2;
  }
  qpool::log::SetLevel(options->log_level);
  if (options->cpu_threads > 0) at::set_num_threads(options->cpu_threads);

  // Signals are taken by sigwait in this thread only; every thread started below inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto repository = qpool::ModelRepository::Open(options->model_repository);
  if (!repository.ok()) {
    std::cerr << "qpool-server: " << repository.status().message() << "\n";
    return 2;
  }
  qpool::DevicePoolOptions pool_options;
  pool_options.default_device = options->device;
  pool_options.max_queue = static_cast<size_t>(options->max_queue);
  auto devices = qpool::DevicePool::Create(pool_options);
  if (!devices.ok()) {
    std::cerr << "qpool-server: " << devices.status().message() << "\n";
    return 2;
  }
  qpool::ArenaAllocator arenas;
  qpool::BlockCopier copier;
  qpool::DeviceMemory memory(arenas);
  qpool::MemoryEventLog events;
  qpool::ResidencyContext residency{&arenas, &copier, &memory, &events};
  qpool::AdmissionOptions admission;
  admission.memory_budget = options->memory_budget;
  qpool::PipelineRegistry registry(*repository, **devices, residency, admission);
  qpool::IdleOffloader idle(registry, **devices);
  qpool::MetricsRegistry metrics;
  metrics.AddGauge("qpool_build_info", "qpool build; the value is 1.", {"version", "torch"})
      .WithLabels({QPOOL_VERSION, TORCH_VERSION})
      .Set(1);
  qpool::MemoryMetrics memory_metrics(metrics, memory, registry, events, (*devices)->devices());
  qpool::api::RequestMetrics request_metrics(metrics);
  qpool::PoolMetrics pool_metrics(metrics, registry, **devices);
  std::unique_ptr<qpool::MetricsHttpServer> metrics_server;
  if (!options->metrics_listen.empty()) {
    auto started = qpool::MetricsHttpServer::Start(options->metrics_listen, metrics);
    if (!started.ok()) {
      std::cerr << "qpool-server: " << started.status().message() << "\n";
      return 1;
    }
    metrics_server = std::move(started).value();
  }

  qpool::api::GrpcServerOptions grpc_options;
  grpc_options.listen = options->listen;
  grpc_options.max_message_bytes = options->max_message_mb << 20;
  auto server = qpool::api::GrpcServer::Start(
      grpc_options,
      qpool::api::EngineRefs{&registry, devices->get(), &memory, &events, &request_metrics});
  if (!server.ok()) {
    std::cerr << "qpool-server: " << server.status().message() << "\n";
    return 1;
  }
  LoadAtStartup(options->load, registry, **devices, *repository);
  (*server)->SetServing(true);
  if (metrics_server) {
    std::cout << "qpool-server metrics on " << metrics_server->address() << std::endl;
  }
  std::cout << "qpool-server listening on " << (*server)->address() << std::endl;
  qpool::log::Info("serving model repository ", repository->root(), " on ", (*server)->address());

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  qpool::log::Info("signal ", signal_number, ": draining for up to ", options->drain_seconds,
                   " s");
  (*server)->Shutdown(options->drain_seconds);
  idle.Stop();
  (*devices)->Stop();
  if (metrics_server) metrics_server->Stop();
  qpool::log::Info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
