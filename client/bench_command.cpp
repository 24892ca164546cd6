// bench: load-tests a server (or every pod behind a headless Service) with Generate requests
// and reports throughput, latency, errors, where requests ran and device memory over time.
// Flags and orchestration here; the load is bench_load, the memory timeline bench_memory, the
// numbers bench_stats and the files bench_report.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench_load.h"
#include "bench_memory.h"
#include "bench_mix.h"
#include "bench_report.h"
#include "bench_stats.h"
#include "commands.h"
#include "output.h"

namespace qpool::cli {
namespace {

using nlohmann::json;

constexpr uint64_t kDefaultRequests = 100;
constexpr uint64_t kDefaultConcurrency = 8;
constexpr double kDefaultMemoryInterval = 0.25;

// The flags that describe one request; --mix replaces all of them.
const char* const kRequestFlags[] = {"pipeline", "prompt",   "negative",   "steps", "width",
                                     "height",   "guidance", "num-images", "seed",  "scheduler"};

// Everything a run needs, checked before connecting.
struct BenchPlan {
  std::vector<RequestTemplate> templates;
  std::string mix_file;  // "" without --mix
  LoadOptions load;
  std::optional<double> deadline_seconds;  // --deadline: for entries without their own
  double memory_interval_seconds = kDefaultMemoryInterval;
  uint64_t random_seed = 0;
  std::string out_dir;  // "" = no files
  std::string label;
};

double PositiveNumber(const ParsedArgs& args, const std::string& flag, bool allow_zero) {
  const double v = GetDouble(args, flag).value();
  if (!std::isfinite(v) || v < 0 || (!allow_zero && v == 0)) {
    throw UsageError{"option '--" + flag + "' wants a number " + (allow_zero ? ">= 0" : "> 0") +
                     ", got '" + GetString(args, flag).value() + "'"};
  }
  return v;
}

std::optional<uint32_t> Uint32Flag(const ParsedArgs& args, const std::string& flag) {
  const std::optional<uint64_t> v = GetUint(args, flag);  // Parse() checked the range
  if (!v) return std::nullopt;
  return static_cast<uint32_t>(*v);
}

// --warmup N (requests) or --warmup Ns (seconds).
void ParseWarmup(const std::string& text, LoadOptions* load) {
  const bool seconds = !text.empty() && text.back() == 's';
  const std::string number = seconds ? text.substr(0, text.size() - 1) : text;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(number.c_str(), &end);
  const bool whole = number.find_first_not_of("0123456789") == std::string::npos;
  if (number.empty() || *end != '\0' || errno != 0 || !std::isfinite(v) || v < 0 ||
      (!seconds && !whole)) {
    throw UsageError{
        "option '--warmup' wants a number of requests (e.g. 8) or of seconds (e.g. "
        "5s), got '" +
        text + "'"};
  }
  if (seconds) {
    load->warmup_seconds = v;
  } else {
    load->warmup_requests = static_cast<uint64_t>(v);
  }
}

RequestTemplate TemplateFromFlags(const ParsedArgs& args) {
  RequestTemplate t;
  t.pipeline = RequiredFlag(args, "pipeline");
  t.name = t.pipeline;
  if (auto v = GetString(args, "prompt")) {
    t.prompts = {*v};
  } else {
    t.prompts = DefaultPrompts();
  }
  t.negative_prompt = GetString(args, "negative");
  t.steps = Uint32Flag(args, "steps");
  t.width = Uint32Flag(args, "width");
  t.height = Uint32Flag(args, "height");
  t.num_images = Uint32Flag(args, "num-images");
  t.guidance = GetDouble(args, "guidance");
  t.seed = GetUint(args, "seed");
  t.scheduler = GetString(args, "scheduler").value_or("");
  return t;
}

BenchPlan PlanBench(const ParsedArgs& args) {
  BenchPlan plan;
  const bool has_request_flags =
      std::any_of(std::begin(kRequestFlags), std::end(kRequestFlags),
                  [&args](const char* flag) { return args.flags.count(flag) != 0; });
  if (auto mix = GetString(args, "mix")) {
    if (has_request_flags) {
      throw UsageError{
          "give --mix FILE or the request flags (--pipeline, --steps, ...), not "
          "both: a mix file names each request's fields"};
    }
    MixResult parsed = LoadMix(*mix);
    if (!parsed.error.empty()) throw UsageError{"--mix: " + parsed.error};
    plan.templates = std::move(parsed.templates);
    plan.mix_file = *mix;
  } else if (args.flags.count("pipeline") == 0) {
    throw UsageError{"give --pipeline NAME (one kind of request) or --mix FILE (several)"};
  } else {
    plan.templates.push_back(TemplateFromFlags(args));
  }

  LoadOptions& load = plan.load;
  if (args.flags.count("rate") != 0) {
    load.rate = PositiveNumber(args, "rate", false);
    if (args.flags.count("concurrency") != 0) {
      throw UsageError{
          "--concurrency sets the closed loop; --rate runs an open loop (requests "
          "are sent on schedule however many are in flight): give one of them"};
    }
  } else if (args.flags.count("arrivals") != 0) {
    throw UsageError{"--arrivals needs --rate (the open loop)"};
  }
  const std::string arrivals = GetString(args, "arrivals").value_or("poisson");
  if (arrivals != "poisson" && arrivals != "uniform") {
    throw UsageError{"option '--arrivals' wants poisson or uniform, got '" + arrivals + "'"};
  }
  load.arrivals = arrivals == "uniform" ? Arrivals::kUniform : Arrivals::kPoisson;
  load.concurrency = GetUint(args, "concurrency").value_or(kDefaultConcurrency);
  if (load.concurrency == 0) throw UsageError{"option '--concurrency' must be at least 1"};
  if (auto v = GetString(args, "warmup")) ParseWarmup(*v, &load);
  if (auto v = GetUint(args, "requests")) {
    if (*v == 0) throw UsageError{"option '--requests' must be at least 1"};
    load.requests = *v;
  }
  if (args.flags.count("duration") != 0) {
    load.duration_seconds = PositiveNumber(args, "duration", false);
  }
  if (!load.requests && !load.duration_seconds) load.requests = kDefaultRequests;
  if (args.flags.count("deadline") != 0) {
    plan.deadline_seconds = PositiveNumber(args, "deadline", false);
  }
  if (args.flags.count("memory-interval") != 0) {
    plan.memory_interval_seconds = PositiveNumber(args, "memory-interval", true);
  }
  plan.random_seed = GetUint(args, "random-seed").value_or(0);
  load.arrival_seed = plan.random_seed;
  plan.out_dir = GetString(args, "out").value_or("");
  if (!plan.out_dir.empty() && std::filesystem::exists(plan.out_dir) &&
      !std::filesystem::is_directory(plan.out_dir)) {
    throw UsageError{"option '--out' names '" + plan.out_dir + "', which is not a directory"};
  }
  plan.label = GetString(args, "label")
                   .value_or(plan.mix_file.empty()
                                 ? plan.templates.front().pipeline
                                 : std::filesystem::path(plan.mix_file).filename().string());
  return plan;
}

std::string ModeText(const BenchPlan& plan) {
  const LoadOptions& load = plan.load;
  std::string text = load.rate > 0
                         ? "open loop, " + FormatFixed(load.rate, 2) + " req/s, " +
                               (load.arrivals == Arrivals::kUniform ? "uniform" : "Poisson") +
                               " arrivals"
                         : "closed loop, concurrency " + std::to_string(load.concurrency);
  if (plan.templates.size() > 1) {
    text += ", mix of " + std::to_string(plan.templates.size());
  }
  return text;
}

json TemplateJson(const RequestTemplate& t) {
  json j = {
      {"name", t.name}, {"weight", t.weight}, {"pipeline", t.pipeline}, {"prompts", t.prompts}};
  if (t.negative_prompt) j["negative_prompt"] = *t.negative_prompt;
  if (t.steps) j["steps"] = *t.steps;
  if (t.width) j["width"] = *t.width;
  if (t.height) j["height"] = *t.height;
  if (t.guidance) j["guidance"] = *t.guidance;
  if (t.num_images) j["num_images"] = *t.num_images;
  if (t.seed) j["seed"] = *t.seed;
  if (!t.scheduler.empty()) j["scheduler"] = t.scheduler;
  if (t.deadline_seconds) j["deadline"] = *t.deadline_seconds;
  return j;
}

json OptionsJson(const BenchPlan& plan) {
  const LoadOptions& load = plan.load;
  json mix = json::array();
  for (const RequestTemplate& t : plan.templates) mix.push_back(TemplateJson(t));
  return {
      {"loop", load.rate > 0 ? "open" : "closed"},
      {"concurrency", load.rate > 0 ? json(nullptr) : json(load.concurrency)},
      {"rate", load.rate > 0 ? json(load.rate) : json(nullptr)},
      {"arrivals", load.rate > 0 ? json(load.arrivals == Arrivals::kUniform ? "uniform" : "poisson")
                                 : json(nullptr)},
      {"warmup_requests", load.warmup_requests},
      {"warmup_seconds", load.warmup_seconds},
      {"requests", load.requests ? json(*load.requests) : json(nullptr)},
      {"duration_seconds", load.duration_seconds ? json(*load.duration_seconds) : json()},
      {"deadline_seconds", plan.deadline_seconds ? json(*plan.deadline_seconds) : json()},
      {"memory_interval_seconds", plan.memory_interval_seconds},
      {"random_seed", plan.random_seed},
      {"mix_file", plan.mix_file},
      {"mix", mix}};
}

v1::GenerateRequest ToProto(const RequestTemplate& t, uint64_t nth) {
  v1::GenerateRequest r;
  r.set_pipeline(t.pipeline);
  r.set_prompt(t.prompts[nth % t.prompts.size()]);
  if (t.negative_prompt) r.set_negative_prompt(*t.negative_prompt);
  if (t.steps) r.set_steps(*t.steps);
  if (t.width) r.set_width(*t.width);
  if (t.height) r.set_height(*t.height);
  if (t.guidance) r.set_guidance_scale(static_cast<float>(*t.guidance));
  if (t.num_images) r.set_num_images(*t.num_images);
  if (t.seed) r.set_seed(*t.seed);
  r.set_scheduler(t.scheduler);
  return r;
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

// Stop requests from SIGINT and SIGTERM: the first stops sending, the second cancels the calls
// in flight. A signal handler can only reach a static.
std::atomic<int> stop_signals{0};

extern "C" void OnStopSignal(int) { stop_signals.fetch_add(1); }

// Routes SIGINT and SIGTERM to stop_signals while it lives.
class StopSignals {
 public:
  StopSignals() {
    stop_signals = 0;
    old_int_ = std::signal(SIGINT, OnStopSignal);
    old_term_ = std::signal(SIGTERM, OnStopSignal);
  }
  ~StopSignals() {
    std::signal(SIGINT, old_int_);
    std::signal(SIGTERM, old_term_);
  }

 private:
  void (*old_int_)(int);
  void (*old_term_)(int);
};

}  // namespace

void CheckBench(const ParsedArgs& args) { PlanBench(args); }

int RunBench(const ParsedArgs& args, const Connection& connection) {
  const BenchPlan plan = PlanBench(args);
  if (!plan.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(plan.out_dir, ec);
    if (ec)
      throw UsageError{"cannot create --out directory '" + plan.out_dir + "': " + ec.message()};
  }

  MixPicker picker(plan.templates, plan.random_seed);
  std::vector<uint64_t> sent_per_template(plan.templates.size(), 0);
  // Called by the runner's thread only.
  RequestSource source = [&](uint64_t) {
    const size_t i = picker.Next();
    const RequestTemplate& t = plan.templates[i];
    PlannedRequest planned;
    planned.request = ToProto(t, sent_per_template[i]++);
    planned.template_name = t.name;
    planned.deadline_seconds = t.deadline_seconds ? t.deadline_seconds : plan.deadline_seconds;
    return planned;
  };

  BenchResults results;
  results.info.label = plan.label;
  results.info.target = connection.target();
  results.info.started_at = UtcNow();
  results.info.mode = ModeText(plan);
  results.info.options = OptionsJson(plan);

  const StopSignals signals;
  const BenchClock::time_point origin = BenchClock::now();
  MemoryMonitor memory(connection, plan.memory_interval_seconds, origin,
                       std::chrono::system_clock::now());
  memory.Start();
  {
    LoadRunner runner(connection, plan.load, source, origin, &stop_signals);
    results.records = runner.Run();
  }
  memory.Stop();
  results.memory = memory.TakePoints();
  results.info.warnings = memory.TakeWarnings();
  if (stop_signals.load() > 0) results.info.warnings.push_back("stopped early by a signal");
  results.summary = Summarize(results.records);

  if (args.global.json) {
    std::cout << SummaryJson(results).dump(2, ' ', false, json::error_handler_t::replace) << "\n";
  } else {
    std::cout << SummaryText(results);
  }
  if (!plan.out_dir.empty()) {
    std::string error;
    if (!WriteReport(plan.out_dir, results, &error)) {
      std::cerr << "error: " << error << "\n";
      return kExitRpcError;
    }
    if (!args.global.json) {
      std::cout << "report: " << (std::filesystem::path(plan.out_dir) / "report.html").string()
                << "\n";
    }
  }
  return results.summary.ok > 0 ? kExitOk : kExitRpcError;
}

}  // namespace qpool::cli
