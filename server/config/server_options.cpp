#include "config/server_options.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>
#include <vector>

#include "util/log.h"

namespace qpool {
namespace {

std::vector<std::string> SplitComma(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// A comma-separated list of one or more names for `flag`: an empty value or an empty item
// ("a,,b", ",") is an error naming the flag, not a shorter list.
StatusOr<std::vector<std::string>> SplitNames(const std::string& flag, const std::string& value,
                                              const char* what) {
  std::vector<std::string> out;
  std::stringstream in(value);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  if (!value.empty() && value.back() == ',') out.emplace_back();
  if (out.empty() || std::find(out.begin(), out.end(), "") != out.end()) {
    return InvalidArgument(
        StrCat(flag, " takes one or more comma-separated ", what, " (got '", value, "')"));
  }
  return out;
}

StatusOr<int> ParseInt(const std::string& flag, const std::string& value, int min, int max) {
  try {
    size_t used = 0;
    const long v = std::stol(value, &used);
    if (used == value.size() && v >= min && v <= max) return static_cast<int>(v);
  } catch (const std::exception&) {
  }
  return InvalidArgument(
      StrCat(flag, " must be an integer between ", min, " and ", max, " (got '", value, "')"));
}

StatusOr<double> ParseFraction(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    const double v = std::stod(value, &used);
    if (used == value.size() && v > 0 && v <= 1) return v;
  } catch (const std::exception&) {
  }
  return InvalidArgument(StrCat(flag, " must be a fraction in (0, 1] (got '", value, "')"));
}

// "48GiB", "512MiB", "1.5GB", "1000000" (bytes) -> bytes; 0 for a plain number <= 1 (a fraction);
// InvalidArgument otherwise.
StatusOr<uint64_t> ParseSize(const std::string& flag, const std::string& value) {
  static const std::vector<std::pair<std::string, double>> kUnits = {{"KiB", 1024.0},
                                                                     {"MiB", 1024.0 * 1024},
                                                                     {"GiB", 1024.0 * 1024 * 1024},
                                                                     {"KB", 1e3},
                                                                     {"MB", 1e6},
                                                                     {"GB", 1e9},
                                                                     {"B", 1.0},
                                                                     {"", 1.0}};
  for (const auto& [unit, scale] : kUnits) {
    if (value.size() <= unit.size() ||
        value.compare(value.size() - unit.size(), unit.size(), unit) != 0) {
      continue;
    }
    const std::string number = value.substr(0, value.size() - unit.size());
    try {
      size_t used = 0;
      const double v = std::stod(number, &used);
      if (used != number.size() || !(v > 0) || v * scale >= 1.8e19) break;
      if (unit.empty() && v <= 1) return uint64_t{0};  // a fraction
      if (scale == 1.0 && v != std::floor(v)) break;   // bytes are whole
      return static_cast<uint64_t>(v * scale);
    } catch (const std::exception&) {
      break;
    }
  }
  return InvalidArgument(
      StrCat(flag, " must be a fraction in (0, 1] or a size such as 48GiB (got '", value, "')"));
}

}  // namespace

bool IsLoopbackListen(const std::string& listen) {
  const auto colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  if (host == "localhost" || host == "[::1]") return true;
  return host.rfind("127.", 0) == 0 && host.find_first_not_of("0123456789.") == std::string::npos;
}

std::string ServerUsage() {
  return R"(usage: qpool-server [flags]
  --model-repository DIR   directory of pipeline folders (default: models)
  --listen HOST:PORT       gRPC address (default: 0.0.0.0:50051; port 0 picks a free port)
  --metrics-listen HOST:PORT  Prometheus /metrics address (default: off; port 0 picks one)
  --agent-listen HOST:PORT  HAProxy agent-check address (default: off; port 0 picks one): each
                           connection reads one line, "up ready N%" with the server's weight
                           from its load (queue, devices, memory, resident pipelines), or
                           "drain" before it serves and while it drains (deploy/haproxy/)
  --http-listen HOST:PORT  OpenAI images API over HTTP/JSON (POST /v1/images/generations,
                           streamed as server-sent events with "stream": true; GET /v1/models,
                           /health/live, /health/ready; docs/http-api.md):
                           default off; port 0 picks one. HTTPS with --tls-cert; bearer
                           tokens and --protect as for gRPC
  --load NAMES             pipelines to load at start: comma-separated names, or "all"
  --devices DEVICES        where pipelines go unless their manifest or a load names a device:
                           auto (every GPU, else CPU) | cpu | cuda | cuda:N | cuda:0,cuda:1
                           (--device is the same flag)
  --memory-budget F        fraction of each GPU's memory qpool may fill with pipelines and
                           requests; beyond it idle pipelines are offloaded, least recently
                           used first, or the load/request fails (default 0.9)
  --host-memory-budget F|SIZE  host memory qpool may fill with pipelines (their pinned host
                           copies): a fraction of the machine's memory (of its cgroup's limit
                           when lower) or a size such as 48GiB; a load beyond it first unloads
                           idle pipelines, least recently used first, or fails (default 0.9)
  --load-on-demand on|off  a request for a pipeline that is not loaded loads it first (its
                           manifest's placement, evicting idle pipelines under the budgets)
                           instead of failing with FAILED_PRECONDITION (default off)
  --max-queue N            requests waiting per device before RESOURCE_EXHAUSTED (default 64)
  --max-message-mb N       largest gRPC message in MiB (default 64)
  --drain-seconds N        on SIGTERM/SIGINT: health NOT_SERVING, new requests UNAVAILABLE,
                           in-flight ones get N s to finish and are cancelled after that;
                           then pipelines are unloaded and the server exits 0 (default 25:
                           inside Kubernetes' default 30 s grace period)
  --drain-notice-seconds N  the first N s of the drain: health NOT_SERVING and the agent says
                           "drain", but new requests are still served, so that balancers that
                           poll stop sending before requests are refused; part of
                           --drain-seconds (default 0: refuse at once)
  --max-watchers N         open WatchMemory streams before RESOURCE_EXHAUSTED (default 256;
                           a stream holds no thread)
  --cpu-threads N          intra-op threads for CPU work (default 0: one per core)
  --attention NAME         the attention kernel tried first for every call: flash, cudnn,
                           efficient or math; a call it cannot take runs the next one in
                           ATen's order (default auto: ATen's own order, cuDNN first on
                           Hopper)
  --profile-dir DIR        record batches with PyTorch's profiler: a Chrome trace and a table
                           of the device's kernels per batch in DIR (default off)
  --profile-skip N         batches run unrecorded first (default 1: the warm-up)
  --profile-batches N      batches recorded after those (default 1)
  --log-level LEVEL        debug | info | warn | error (default info)
 TLS and credentials (docs/security.md):
  --tls-cert FILE          serve gRPC over TLS with this PEM certificate chain (with --tls-key)
  --tls-key FILE           the certificate's PEM private key (unencrypted; chmod 600)
  --tls-client-ca FILE     require client certificates verified by this PEM CA bundle (mTLS)
  --tls-reload-seconds N   re-read the certificate, key and CA files every N s: a renewed
                           certificate serves new connections without a restart (default 60)
  --metrics-tls auto|on|off  /metrics over HTTPS with --tls-cert and --tls-key; auto: when
                           --metrics-listen is not a loopback address (default auto)
  --admin-token-file FILE  bearer tokens (one per line, '#' comments; re-read when the file
                           changes) accepted as 'authorization: Bearer <token>' metadata
  --admin-clients NAMES    comma-separated client certificate identities (subject CN, or a DNS
                           or URI SAN) whose calls are authorized; needs --tls-client-ca
  --protect CLASSES        call classes that need a token or an allowed certificate besides
                           admin (load, unload, offload, onload, move, policy, empty-cache,
                           allocator snapshot), which always does once a credential is set:
                           inference (generate, encode), read (list, memory report, watch
                           memory), or all, comma-separated. Health checks and reflection stay
                           open for probes
  --help                   this text
  --version                the version
)";
}

StatusOr<ServerOptions> ParseServerOptions(int argc, char** argv, const std::string& version) {
  // Every flag takes a value; knowing them first makes a typo "unknown", not "needs a value".
  static const char* const kFlags[] = {"--model-repository",
                                       "--listen",
                                       "--metrics-listen",
                                       "--agent-listen",
                                       "--http-listen",
                                       "--load",
                                       "--devices",
                                       "--device",
                                       "--memory-budget",
                                       "--host-memory-budget",
                                       "--load-on-demand",
                                       "--max-queue",
                                       "--max-message-mb",
                                       "--max-watchers",
                                       "--drain-seconds",
                                       "--drain-notice-seconds",
                                       "--cpu-threads",
                                       "--attention",
                                       "--profile-dir",
                                       "--profile-skip",
                                       "--profile-batches",
                                       "--log-level",
                                       "--tls-cert",
                                       "--tls-key",
                                       "--tls-client-ca",
                                       "--tls-reload-seconds",
                                       "--metrics-tls",
                                       "--admin-token-file",
                                       "--admin-clients",
                                       "--protect"};
  ServerOptions o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    const auto eq = flag.find('=');
    if (flag == "--help" || flag == "-h") return Status(StatusCode::kCancelled, ServerUsage());
    if (flag == "--version")
      return Status(StatusCode::kCancelled, "qpool-server " + version + "\n");
    if (flag.rfind("--", 0) != 0)
      return InvalidArgument(StrCat("unexpected argument '", flag, "'"));
    const std::string name = flag.substr(0, eq);
    if (std::find(std::begin(kFlags), std::end(kFlags), name) == std::end(kFlags)) {
      return InvalidArgument(StrCat("unknown flag '", name, "' (see --help)"));
    }
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = name;
    } else {
      if (i + 1 >= argc) return InvalidArgument(StrCat(flag, " needs a value"));
      value = argv[++i];
    }
    // A flag naming a file or an address with an empty value is an unset variable in a script
    // (`--tls-cert "$CERT"`), not a request to turn the feature off.
    static const char* const kNonEmpty[] = {
        "--model-repository", "--listen",        "--tls-cert",         "--tls-key",
        "--tls-client-ca",    "--admin-token-file", "--devices",       "--device",
        "--attention",        "--metrics-listen"};
    if (value.empty() &&
        std::find(std::begin(kNonEmpty), std::end(kNonEmpty), flag) != std::end(kNonEmpty)) {
      return InvalidArgument(StrCat(flag, " needs a value (got '')"));
    }
    if (flag == "--model-repository") {
      o.model_repository = value;
    } else if (flag == "--listen") {
      o.listen = value;
    } else if (flag == "--metrics-listen") {
      o.metrics_listen = value;
    } else if (flag == "--http-listen") {
      if (value.empty()) return InvalidArgument("--http-listen needs HOST:PORT");
      o.http_listen = value;
    } else if (flag == "--agent-listen") {
      if (value.empty()) return InvalidArgument("--agent-listen needs HOST:PORT");
      o.agent_listen = value;
    } else if (flag == "--load") {
      o.load = SplitComma(value);
    } else if (flag == "--devices" || flag == "--device") {
      o.device = value;
    } else if (flag == "--memory-budget") {
      ASSIGN_OR_RETURN(o.memory_budget, ParseFraction(flag, value));
    } else if (flag == "--host-memory-budget") {
      ASSIGN_OR_RETURN(o.host_memory_budget_bytes, ParseSize(flag, value));
      if (o.host_memory_budget_bytes == 0) {
        ASSIGN_OR_RETURN(o.host_memory_budget, ParseFraction(flag, value));
      }
    } else if (flag == "--load-on-demand") {
      if (value != "on" && value != "off") {
        return InvalidArgument(StrCat("--load-on-demand must be on or off (got '", value, "')"));
      }
      o.load_on_demand = value == "on";
    } else if (flag == "--max-queue") {
      ASSIGN_OR_RETURN(o.max_queue, ParseInt(flag, value, 1, 100000));
    } else if (flag == "--max-message-mb") {
      ASSIGN_OR_RETURN(o.max_message_mb, ParseInt(flag, value, 1, 2047));
    } else if (flag == "--max-watchers") {
      ASSIGN_OR_RETURN(o.max_watchers, ParseInt(flag, value, 0, 100000));
    } else if (flag == "--drain-seconds") {
      ASSIGN_OR_RETURN(o.drain_seconds, ParseInt(flag, value, 0, 3600));
    } else if (flag == "--drain-notice-seconds") {
      ASSIGN_OR_RETURN(o.drain_notice_seconds, ParseInt(flag, value, 0, 3600));
    } else if (flag == "--cpu-threads") {
      ASSIGN_OR_RETURN(o.cpu_threads, ParseInt(flag, value, 0, 1024));
    } else if (flag == "--attention") {
      o.attention = value;
    } else if (flag == "--profile-dir") {
      if (value.empty()) return InvalidArgument("--profile-dir needs a directory");
      o.profile_dir = value;
    } else if (flag == "--profile-skip") {
      ASSIGN_OR_RETURN(o.profile_skip, ParseInt(flag, value, 0, 1000000));
    } else if (flag == "--profile-batches") {
      ASSIGN_OR_RETURN(o.profile_batches, ParseInt(flag, value, 1, 1000));
    } else if (flag == "--log-level") {
      if (value != "debug" && value != "info" && value != "warn" && value != "error") {
        return InvalidArgument(StrCat("--log-level must be debug, info, warn or error"));
      }
      o.log_level = value;
    } else if (flag == "--tls-cert") {
      o.tls_cert = value;
    } else if (flag == "--tls-key") {
      o.tls_key = value;
    } else if (flag == "--tls-client-ca") {
      o.tls_client_ca = value;
    } else if (flag == "--tls-reload-seconds") {
      ASSIGN_OR_RETURN(o.tls_reload_seconds, ParseInt(flag, value, 1, 86400));
    } else if (flag == "--metrics-tls") {
      if (value != "auto" && value != "on" && value != "off") {
        return InvalidArgument(StrCat("--metrics-tls must be auto, on or off (got '", value, "')"));
      }
      o.metrics_tls = value;
    } else if (flag == "--admin-token-file") {
      o.admin_token_file = value;
    } else if (flag == "--admin-clients") {
      ASSIGN_OR_RETURN(o.admin_clients, SplitNames(flag, value, "client certificate identities"));
    } else if (flag == "--protect") {
      // Note [Admin credentials]: admin calls are always protected; the flag adds classes.
      ASSIGN_OR_RETURN(std::vector<std::string> names,
                       SplitNames(flag, value, "classes: admin, inference, read or all"));
      std::vector<std::string> protect = {"admin"};
      for (const std::string& name : names) {
        if (name != "admin" && name != "inference" && name != "read" && name != "all") {
          return InvalidArgument(StrCat(
              "--protect takes admin, inference, read or all, comma-separated (got '", name, "')"));
        }
        for (const char* c : {"inference", "read"}) {
          if ((name == c || name == "all") &&
              std::find(protect.begin(), protect.end(), c) == protect.end()) {
            protect.push_back(c);
          }
        }
      }
      o.protect = std::move(protect);
    } else {
      return InvalidArgument(StrCat("unknown flag '", flag, "' (see --help)"));
    }
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return InvalidArgument("--tls-cert and --tls-key go together");
  }
  if (!o.tls_client_ca.empty() && o.tls_cert.empty()) {
    return InvalidArgument("--tls-client-ca needs --tls-cert and --tls-key (mTLS is TLS first)");
  }
  if (!o.admin_clients.empty() && o.tls_client_ca.empty()) {
    return InvalidArgument(
        "--admin-clients needs --tls-client-ca: only verified client certificates name a client");
  }
  if (o.drain_notice_seconds > o.drain_seconds) {
    return InvalidArgument(StrCat("--drain-notice-seconds (", o.drain_notice_seconds,
                                  ") is part of --drain-seconds (", o.drain_seconds,
                                  ") and cannot exceed it"));
  }
  if (o.metrics_tls == "on" && o.tls_cert.empty()) {
    return InvalidArgument("--metrics-tls on needs --tls-cert and --tls-key");
  }
  return o;
}

}  // namespace qpool
