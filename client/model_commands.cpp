// list, load, unload, offload, onload, move, policy, empty-cache, memory, health: the
// ModelService and health commands.
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "health_check.h"
#include "output.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::cli {
namespace {

using nlohmann::json;

// "loaded" for PIPELINE_STATE_LOADED, etc.
std::string StateName(v1::PipelineState state) {
  switch (state) {
    case v1::PIPELINE_STATE_AVAILABLE:
      return "available";
    case v1::PIPELINE_STATE_LOADED:
      return "loaded";
    case v1::PIPELINE_STATE_FAILED:
      return "failed";
    default:
      return "unspecified";
  }
}

json ComponentJson(const v1::ComponentInfo& c) {
  return {{"name", c.name()},
          {"device", c.device()},
          {"dtype", c.dtype()},
          {"quantization", c.quantization()},
          {"weight_bytes", c.weight_bytes()},
          {"quant_state_bytes", c.quant_state_bytes()},
          {"other_bytes", c.other_bytes()},
          {"graph_bytes", c.graph_bytes()}};
}

// Every replica's device, "cuda:0,cuda:1"; the pipeline's device when it reports no replicas.
std::string Devices(const v1::PipelineInfo& p) {
  std::string out;
  for (const auto& r : p.replicas()) out += (out.empty() ? "" : ",") + r.device();
  return out.empty() ? p.device() : out;
}

json PipelineJson(const v1::PipelineInfo& p) {
  json components = json::array();
  for (const auto& c : p.components()) components.push_back(ComponentJson(c));
  json replicas = json::array();
  for (const auto& r : p.replicas()) {
    replicas.push_back({{"device", r.device()},
                        {"residency", r.residency()},
                        {"in_flight", r.in_flight()},
                        {"device_bytes", r.device_bytes()},
                        {"host_bytes", r.host_bytes()}});
  }
  return {{"name", p.name()},
          {"kind", p.kind()},
          {"state", StateName(p.state())},
          {"device", p.device()},
          {"error", p.error()},
          {"in_flight", p.in_flight()},
          {"default_steps", p.default_steps()},
          {"default_width", p.default_width()},
          {"default_height", p.default_height()},
          {"schedulers", std::vector<std::string>(p.schedulers().begin(), p.schedulers().end())},
          {"components", components},
          {"replicas", replicas},
          {"max_queue", p.max_queue()},
          {"max_batch", p.max_batch()},
          {"max_batch_delay_ms", p.max_batch_delay_ms()},
          {"files_changed",
           std::vector<std::string>(p.files_changed().begin(), p.files_changed().end())},
          {"offload",
           {{"policy", p.offload_policy().policy()},
            {"idle_seconds", p.offload_policy().idle_seconds()},
            {"group_mib", p.offload_policy().group_mib()},
            {"prefetch", p.offload_policy().prefetch()},
            {"resident_mib", p.offload_policy().resident_mib()}}}};
}

// "none", "idle 300s", "sequential 64MiB+2" (group size and prefetch) as `qpool list` shows it.
std::string OffloadText(const v1::OffloadPolicy& o) {
  std::ostringstream out;
  out << o.policy();
  if (o.policy() == "idle") out << " " << o.idle_seconds() << "s";
  if (o.policy() == "sequential") {
    out << " " << o.group_mib() << "MiB+" << o.prefetch();
    if (o.resident_mib() > 0) out << " keep " << o.resident_mib() << "MiB";
  }
  return out.str();
}

uint64_t PipelineBytes(const v1::PipelineInfo& p) {
  uint64_t total = 0;
  for (const auto& c : p.components()) {
    total += c.weight_bytes() + c.quant_state_bytes() + c.other_bytes() + c.graph_bytes();
  }
  return total;
}

std::string Join(const google::protobuf::RepeatedPtrField<std::string>& items) {
  std::string s;
  for (const std::string& item : items) s += (s.empty() ? "" : ",") + item;
  return s;
}

// Prints a ResidencyChange: each component's move, or that nothing had to move.
int PrintChange(const ParsedArgs& args, const char* verb, const v1::ResidencyChange& change) {
  if (args.global.json) {
    json moves = json::array();
    for (const auto& m : change.moves()) {
      moves.push_back({{"component", m.component()},
                       {"from", m.from()},
                       {"to", m.to()},
                       {"bytes", m.bytes()},
                       {"seconds", m.seconds()},
                       {"tensors_checked", m.tensors_checked()}});
    }
    std::cout << json{{"pipeline", PipelineJson(change.pipeline())},
                      {"moves", moves},
                      {"bytes", change.bytes()},
                      {"seconds", change.seconds()}}
                     .dump(2)
              << "\n";
    return kExitOk;
  }
  std::cout << verb << " " << change.pipeline().name() << ": " << FormatBytes(change.bytes())
            << " in " << change.seconds() << " s\n";
  for (const auto& m : change.moves()) {
    std::cout << "  " << m.component() << ": " << m.from() << " -> " << m.to() << ", "
              << FormatBytes(m.bytes()) << ", " << m.tensors_checked() << " tensors checked\n";
  }
  if (change.moves().empty()) std::cout << "  nothing had to move\n";
  return kExitOk;
}

// Runs one ModelService call that answers a ResidencyChange.
template <typename Request, typename Call>
int RunChange(const ParsedArgs& args, const Connection& connection, const char* verb,
              const Request& request, Call call) {
  auto stub = v1::ModelService::NewStub(connection.channel());
  grpc::ClientContext context;
  connection.Prepare(&context);
  v1::ResidencyChange change;
  const grpc::Status status = ((*stub).*call)(&context, request, &change);
  if (!status.ok()) return connection.Fail(status);
  return PrintChange(args, verb, change);
}

}  // namespace

int RunOffload(const ParsedArgs& args, const Connection& connection) {
  v1::OffloadPipelineRequest request;
  request.set_name(args.positional.at(0));
  return RunChange(args, connection, "offloaded", request,
                   &v1::ModelService::Stub::OffloadPipeline);
}

int RunOnload(const ParsedArgs& args, const Connection& connection) {
  v1::OnloadPipelineRequest request;
  request.set_name(args.positional.at(0));
  request.set_device(GetString(args, "device").value_or(""));
  return RunChange(args, connection, "onloaded", request, &v1::ModelService::Stub::OnloadPipeline);
}

int RunMove(const ParsedArgs& args, const Connection& connection) {
  v1::MovePipelineRequest request;
  request.set_name(args.positional.at(0));
  request.set_device(RequiredFlag(args, "device"));
  return RunChange(args, connection, "moved", request, &v1::ModelService::Stub::MovePipeline);
}

int RunPolicy(const ParsedArgs& args, const Connection& connection) {
  v1::SetOffloadPolicyRequest request;
  request.set_name(args.positional.at(0));
  request.mutable_policy()->set_policy(args.positional.at(1));
  request.mutable_policy()->set_idle_seconds(GetDouble(args, "idle-seconds").value_or(0));
  auto stub = v1::ModelService::NewStub(connection.channel());
  grpc::ClientContext context;
  connection.Prepare(&context);
  v1::SetOffloadPolicyResponse response;
  const grpc::Status status = stub->SetOffloadPolicy(&context, request, &response);
  if (!status.ok()) return connection.Fail(status);
  if (args.global.json) {
    std::cout << PipelineJson(response.pipeline()).dump(2) << "\n";
  } else {
    std::cout << response.pipeline().name() << ": offload "
              << OffloadText(response.pipeline().offload_policy()) << "\n";
  }
  return kExitOk;
}

int RunEmptyCache(const ParsedArgs& args, const Connection& connection) {
  v1::EmptyCacheRequest request;
  request.set_device(GetString(args, "device").value_or(""));
  auto stub = v1::ModelService::NewStub(connection.channel());
  grpc::ClientContext context;
  connection.Prepare(&context);
  v1::EmptyCacheResponse response;
  const grpc::Status status = stub->EmptyCache(&context, request, &response);
  if (!status.ok()) return connection.Fail(status);
  if (args.global.json) {
    json devices = json::array();
    for (int i = 0; i < response.after_size(); ++i) {
      const auto& after = response.after(i);
      const uint64_t before = i < response.before_size() ? response.before(i).reserved_bytes() : 0;
      devices.push_back({{"device", after.device()},
                         {"reserved_before_bytes", before},
                         {"reserved_after_bytes", after.reserved_bytes()}});
    }
    std::cout << json{{"released_bytes", response.released_bytes()}, {"devices", devices}}.dump(2)
              << "\n";
  } else {
    std::cout << "released " << FormatBytes(response.released_bytes()) << "\n";
  }
  return kExitOk;
}

int RunSnapshot(const ParsedArgs& args, const Connection& connection) {
  const std::string path = RequiredFlag(args, "out");
  auto stub = v1::ModelService::NewStub(connection.channel());
  grpc::ClientContext context;
  connection.Prepare(&context);
  v1::AllocatorSnapshot snapshot;
  const grpc::Status status =
      stub->GetAllocatorSnapshot(&context, v1::GetAllocatorSnapshotRequest(), &snapshot);
  if (!status.ok()) return connection.Fail(status);
  std::string error;
  if (!WriteFile(path, snapshot.pickle(), &error)) {
    std::cerr << "error: " << error << "\n";
    return kExitRpcError;
  }
  if (args.global.json) {
    std::cout << json{{"out", path}, {"bytes", snapshot.pickle().size()}}.dump(2) << "\n";
  } else {
    std::cout << "wrote " << path << " (" << FormatBytes(snapshot.pickle().size())
              << "): open it at https://pytorch.org/memory_viz\n";
  }
  return kExitOk;
}

int RunWatch(const ParsedArgs& args, const Connection& connection) {
  v1::WatchMemoryRequest request;
  request.set_after_sequence(GetUint(args, "after").value_or(0));
  const uint64_t count = GetUint(args, "count").value_or(0);
  auto stub = v1::ModelService::NewStub(connection.channel());
  grpc::ClientContext context;
  connection.Prepare(&context);
  auto stream = stub->WatchMemory(&context, request);
  v1::MemoryEvent e;
  uint64_t seen = 0;
  while ((count == 0 || seen < count) && stream->Read(&e)) {
    ++seen;
    if (args.global.json) {
      std::cout << json{{"sequence", e.sequence()},
                        {"unix_nanos", e.unix_nanos()},
                        {"kind", e.kind()},
                        {"pipeline", e.pipeline()},
                        {"component", e.component()},
                        {"device", e.device()},
                        {"from_device", e.from_device()},
                        {"to_device", e.to_device()},
                        {"allocated_before", e.allocated_before()},
                        {"allocated_after", e.allocated_after()},
                        {"reserved_before", e.reserved_before()},
                        {"reserved_after", e.reserved_after()},
                        {"attributed_delta_bytes", e.attributed_delta_bytes()},
                        {"duration_seconds", e.duration_seconds()},
                        {"outcome", e.outcome()},
                        {"message", e.message()}}
                       .dump()
                << std::endl;
    } else {
      std::cout << e.sequence() << " " << e.kind() << " " << e.pipeline()
                << (e.component().empty() ? "" : "/" + e.component()) << " on " << e.device()
                << ": " << e.outcome() << ", allocated " << FormatBytes(e.allocated_before())
                << " -> " << FormatBytes(e.allocated_after()) << ", " << e.duration_seconds()
                << " s" << (e.message().empty() ? "" : " (" + e.message() + ")") << std::endl;
    }
  }
  if (count != 0 && seen == count) {
    context.TryCancel();  // done: the server's stream would go on
    stream->Finish();
    return kExitOk;
  }
  const grpc::Status status = stream->Finish();
  return status.ok() ? kExitOk : connection.Fail(status);
}

int RunList(const ParsedArgs& args, const Connection& connection) {
  auto stub = v1::ModelService::NewStub(connection.channel());
  grpc::ClientContext context;
  connection.Prepare(&context);
  v1::ListPipelinesResponse response;
  const grpc::Status status = stub->ListPipelines(&context, v1::ListPipelinesRequest(), &response);
  if (!status.ok()) return connection.Fail(status);

  if (args.global.json) {
    json pipelines = json::array();
    for (const auto& p : response.pipelines()) pipelines.push_back(PipelineJson(p));
    std::cout << json{{"pipelines", pipelines}}.dump(2) << "\n";
    return kExitOk;
  }
  Table table({"NAME", "KIND", "STATE", "DEVICE", "IN_FLIGHT", "SIZE", "OFFLOAD", "DEFAULTS",
               "SCHEDULERS"});
  for (const auto& p : response.pipelines()) {
    const bool loaded = p.state() == v1::PIPELINE_STATE_LOADED;
    table.AddRow({p.name(), p.kind(), StateName(p.state()), Devices(p),
                  std::to_string(p.in_flight()), loaded ? FormatBytes(PipelineBytes(p)) : "",
                  loaded ? OffloadText(p.offload_policy()) : "",
                  p.default_steps() ? std::to_string(p.default_steps()) + " steps " +
                                          std::to_string(p.default_width()) + "x" +
                                          std::to_string(p.default_height())
                                    : "",
                  Join(p.schedulers())});
  }
  std::cout << table.ToString();
  for (const auto& p : response.pipelines()) {
    if (!p.error().empty()) std::cout << p.name() << ": " << p.error() << "\n";
    if (p.files_changed_size() > 0) {
      std::cout << p.name() << ": serves what it read at load; changed on disk since: "
                << Join(p.files_changed()) << " (load it again to serve them)\n";
    }
  }
  return kExitOk;
}

int RunLoad(const ParsedArgs& args, const Connection& connection) {
  v1::LoadPipelineRequest request;
  request.set_name(args.positional.at(0));
  request.set_device(GetString(args, "device").value_or(""));
  auto stub = v1::ModelService::NewStub(connection.channel());
  grpc::ClientContext context;
  connection.Prepare(&context);
  v1::LoadPipelineResponse response;
  const grpc::Status status = stub->LoadPipeline(&context, request, &response);
  if (!status.ok()) return connection.Fail(status);

  const v1::PipelineInfo& p = response.pipeline();
  const v1::LoadStages& st = response.stages();
  if (args.global.json) {
    json out{{"pipeline", PipelineJson(p)},
             {"load_seconds", response.load_seconds()},
             {"already_loaded", response.already_loaded()}};
    if (response.has_stages()) {
      out["stages"] =
          json{{"verify_seconds", st.verify_seconds()}, {"read_seconds", st.read_seconds()},
               {"read_bytes", st.read_bytes()},         {"quantize_seconds", st.quantize_seconds()},
               {"pack_seconds", st.pack_seconds()},     {"device_seconds", st.device_seconds()},
               {"warmup_seconds", st.warmup_seconds()}};
    }
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  if (response.already_loaded()) {
    std::cout << request.name() << " was already loaded on " << Devices(p) << "\n";
  } else {
    std::cout << "loaded " << request.name() << " on " << Devices(p) << " in "
              << FormatFixed(response.load_seconds(), 2) << " s (" << p.components_size()
              << " components, " << FormatBytes(PipelineBytes(p)) << ")\n";
    if (response.has_stages()) {
      std::cout << "  read " << FormatBytes(st.read_bytes()) << " of files in "
                << FormatFixed(st.read_seconds(), 2) << " s, verified "
                << FormatFixed(st.verify_seconds(), 2) << " s, quantized "
                << FormatFixed(st.quantize_seconds(), 2) << " s, packed on the host "
                << FormatFixed(st.pack_seconds(), 2) << " s, copied to the device "
                << FormatFixed(st.device_seconds(), 2) << " s, warm-up "
                << FormatFixed(st.warmup_seconds(), 2) << " s\n";
    }
  }
  return kExitOk;
}

int RunUnload(const ParsedArgs& args, const Connection& connection) {
  v1::UnloadPipelineRequest request;
  request.set_name(args.positional.at(0));
  auto stub = v1::ModelService::NewStub(connection.channel());
  grpc::ClientContext context;
  connection.Prepare(&context);
  v1::UnloadPipelineResponse response;
  const grpc::Status status = stub->UnloadPipeline(&context, request, &response);
  if (!status.ok()) return connection.Fail(status);
  if (args.global.json) {
    std::cout << json{{"name", response.name()}, {"freed_bytes", response.freed_bytes()}}.dump(2)
              << "\n";
  } else {
    std::cout << "unloaded " << response.name() << " (freed " << FormatBytes(response.freed_bytes())
              << ")\n";
  }
  return kExitOk;
}

namespace {

// A GPU's figures and how they add up (docs/metrics.md, "How the figures add up"); the driver's
// are absent, not zero, where the server cannot read them.
json BreakdownJson(const v1::MemoryBreakdown& b) {
  json out = {{"tensor_bytes", b.tensor_bytes()},
              {"graph_pool_allocated_bytes", b.graph_pool_allocated_bytes()},
              {"workspace_bytes", b.workspace_bytes()},
              {"working_bytes", b.working_bytes()},
              {"graph_pool_reserved_bytes", b.graph_pool_reserved_bytes()},
              {"cached_bytes", b.cached_bytes()}};
  if (b.has_driver_process_bytes()) out["driver_process_bytes"] = b.driver_process_bytes();
  if (b.has_driver_used_bytes()) out["driver_used_bytes"] = b.driver_used_bytes();
  if (b.has_driver_total_bytes()) out["driver_total_bytes"] = b.driver_total_bytes();
  if (b.has_context_bytes()) out["context_bytes"] = b.context_bytes();
  if (b.has_outside_allocator_bytes()) {
    out["outside_allocator_bytes"] = b.outside_allocator_bytes();
  }
  return out;
}

// One line per sum: allocated, reserved and (with the driver's figures) the process's total.
void PrintBreakdowns(const v1::MemoryReport& report) {
  for (const auto& d : report.devices()) {
    if (!d.has_breakdown()) continue;
    const v1::MemoryBreakdown& b = d.breakdown();
    std::cout << "\n" << d.device() << ": allocated " << FormatBytes(d.allocated_bytes())
              << " = tensors " << FormatBytes(b.tensor_bytes()) << " + graph pools "
              << FormatBytes(b.graph_pool_allocated_bytes()) << " + workspaces "
              << FormatBytes(b.workspace_bytes()) << " + working "
              << FormatBytes(b.working_bytes()) << "\n"
              << d.device() << ": reserved " << FormatBytes(d.reserved_bytes())
              << " = allocated + cached " << FormatBytes(b.cached_bytes()) << " (graph pools hold "
              << FormatBytes(b.graph_pool_reserved_bytes()) << ")\n";
    if (b.has_driver_process_bytes() && b.has_context_bytes()) {
      std::cout << d.device() << ": driver " << FormatBytes(b.driver_process_bytes())
                << " = reserved + context " << FormatBytes(b.context_bytes())
                << " + outside the allocator " << FormatBytes(b.outside_allocator_bytes())
                << "\n";
    } else {
      std::cout << d.device() << ": the driver's figures are not available\n";
    }
  }
}

}  // namespace

int RunMemory(const ParsedArgs& args, const Connection& connection) {
  auto stub = v1::ModelService::NewStub(connection.channel());
  grpc::ClientContext context;
  connection.Prepare(&context);
  v1::MemoryReport report;
  const grpc::Status status =
      stub->GetMemoryReport(&context, v1::GetMemoryReportRequest(), &report);
  if (!status.ok()) return connection.Fail(status);

  if (args.global.json) {
    json devices = json::array();
    for (const auto& d : report.devices()) {
      json device = {{"device", d.device()},
                     {"allocated_bytes", d.allocated_bytes()},
                     {"reserved_bytes", d.reserved_bytes()},
                     {"total_bytes", d.total_bytes()},
                     {"free_bytes", d.free_bytes()},
                     {"pipeline_bytes", d.pipeline_bytes()}};
      if (d.has_breakdown()) device["breakdown"] = BreakdownJson(d.breakdown());
      devices.push_back(std::move(device));
    }
    json pipelines = json::array();
    for (const auto& p : report.pipelines()) pipelines.push_back(PipelineJson(p));
    std::cout << json{{"devices", devices}, {"pipelines", pipelines}}.dump(2) << "\n";
    return kExitOk;
  }
  Table devices({"DEVICE", "ALLOCATED", "RESERVED", "TOTAL", "FREE"});
  for (const auto& d : report.devices()) {
    devices.AddRow({d.device(), FormatBytes(d.allocated_bytes()), FormatBytes(d.reserved_bytes()),
                    d.total_bytes() ? FormatBytes(d.total_bytes()) : "-",
                    d.total_bytes() ? FormatBytes(d.free_bytes()) : "-"});
  }
  std::cout << devices.ToString();
  PrintBreakdowns(report);
  if (report.pipelines_size() == 0) {
    std::cout << "\nno pipeline loaded\n";
    return kExitOk;
  }
  Table components({"PIPELINE", "COMPONENT", "DEVICE", "DTYPE", "QUANT", "WEIGHTS", "QUANT_STATE",
                    "OTHER", "GRAPHS"});
  for (const auto& p : report.pipelines()) {
    for (const auto& c : p.components()) {
      components.AddRow({p.name(), c.name(), c.device(), c.dtype(), c.quantization(),
                         FormatBytes(c.weight_bytes()), FormatBytes(c.quant_state_bytes()),
                         FormatBytes(c.other_bytes()), FormatBytes(c.graph_bytes())});
    }
  }
  std::cout << "\n" << components.ToString();
  return kExitOk;
}

int RunHealth(const ParsedArgs& args, const Connection& connection) {
  const std::string service = GetString(args, "service").value_or("");
  grpc::ClientContext context;
  connection.Prepare(&context);
  ServingStatus serving = ServingStatus::kUnknown;
  const grpc::Status status = CheckHealth(connection.channel(), &context, service, &serving);
  if (!status.ok()) return connection.Fail(status);
  if (args.global.json) {
    std::cout << json{{"service", service}, {"status", ServingStatusName(serving)}}.dump(2) << "\n";
  } else {
    std::cout << ServingStatusName(serving) << "\n";
  }
  return serving == ServingStatus::kServing ? kExitOk : kExitRpcError;
}

}  // namespace qpool::cli
