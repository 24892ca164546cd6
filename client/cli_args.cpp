#include "cli_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace qpool::cli {
namespace {

// How Parse checks a flag's value, so that bad values are usage errors before any RPC.
enum class FlagType { kString, kUint, kUint32, kNumber };

struct FlagSpec {
  const char* name;        // without "--"
  const char* value_name;  // nullptr for a switch
  const char* help;
  FlagType type = FlagType::kString;
  bool required = false;
};

struct CommandSpec {
  const char* name;
  const char* positional;  // usage text of the positional arguments, "" if none
  int min_positional;
  int max_positional;  // -1 = unlimited
  const char* summary;
  std::vector<FlagSpec> flags;
  const char* notes = nullptr;  // more help after the options, or none
};

const std::vector<FlagSpec>& GlobalFlags() {
  static const std::vector<FlagSpec> flags = {
      {"server", "HOST:PORT", "server address (default $QPOOL_SERVER or 127.0.0.1:50051)"},
      {"json", nullptr, "print one JSON document on stdout"},
      {"timeout", "SECONDS", "deadline of each RPC (default: none)"},
      {"connect-timeout", "SECONDS", "how long to wait for a connection (default 10)"},
      {"tls", nullptr, "connect with TLS, verifying the server against the system's CAs"},
      {"ca", "FILE", "connect with TLS, verifying the server against these PEM CAs"},
      {"cert", "FILE", "client certificate (PEM) for servers that require one (mTLS)"},
      {"key", "FILE", "the client certificate's PEM private key"},
      {"server-name", "NAME", "name the server's certificate must carry (default: HOST)"},
      {"token-file", "FILE",
       "send the file's first token as 'authorization: Bearer' (default $QPOOL_TOKEN_FILE)"},
      {"help", nullptr, "show help"},
  };
  return flags;
}

const std::vector<CommandSpec>& Commands() {
  static const std::vector<CommandSpec> commands = {
      {"generate",
       "",
       0,
       0,
       "generate images from a prompt and write them as PNG files",
       {{"pipeline", "NAME", "pipeline to run (required)", FlagType::kString, true},
        {"prompt", "TEXT", "the prompt (required)", FlagType::kString, true},
        {"negative", "TEXT", "negative prompt (\"\" is an empty one; unset is none)"},
        {"steps", "N", "denoising steps (default: the pipeline's)", FlagType::kUint32},
        {"guidance", "F", "guidance scale; <= 1 disables classifier-free guidance",
         FlagType::kNumber},
        {"width", "W", "image width, a multiple of 8", FlagType::kUint32},
        {"height", "H", "image height, a multiple of 8", FlagType::kUint32},
        {"num-images", "N", "number of images (default 1)", FlagType::kUint32},
        {"seed", "S", "seed of the first image (default: random, printed)", FlagType::kUint},
        {"scheduler", "NAME",
         "ddim, euler, euler_a, dpmpp_2m[_sde][_karras], unipc[_karras] (default: the pipeline's)"},
        {"original-width", "W", "sdxl size conditioning: original width (default: --width)",
         FlagType::kUint32},
        {"original-height", "H", "sdxl size conditioning: original height (default: --height)",
         FlagType::kUint32},
        {"target-width", "W", "sdxl size conditioning: target width (default: --width)",
         FlagType::kUint32},
        {"target-height", "H", "sdxl size conditioning: target height (default: --height)",
         FlagType::kUint32},
        {"crop-top", "N", "sdxl size conditioning: crop top (default 0)", FlagType::kUint32},
        {"crop-left", "N", "sdxl size conditioning: crop left (default 0)", FlagType::kUint32},
        {"true-cfg", "F",
         "flux: classifier-free guidance scale with --negative (> 1 runs the transformer twice)",
         FlagType::kNumber},
        {"out", "PATH",
         "directory, or file pattern with {seed} and {i} (default ./qpool-{seed}-{i}.png)"}}},
      {"encode",
       "PROMPT...",
       1,
       -1,
       "run the text encoder and print the embeddings' shape and stats",
       {{"pipeline", "NAME", "pipeline whose text encoder runs (required)", FlagType::kString,
         true},
        {"out", "FILE", "also write the raw embedding bytes (row-major, little-endian)"},
        {"dtype", "T", "the embeddings' dtype: float32 (default), bfloat16 or float16"}}},
      {"list", "", 0, 0, "list the pipelines of the model repository", {}},
      {"load",
       "NAME",
       1,
       1,
       "load a pipeline",
       {{"device", "D", "device to load on, e.g. cpu or cuda:1 (default: the server's choice)"}}},
      {"unload", "NAME", 1, 1, "unload a pipeline and free its memory", {}},
      {"offload", "NAME", 1, 1, "move every component of a pipeline to pinned host memory", {}},
      {"onload",
       "NAME",
       1,
       1,
       "bring an offloaded pipeline back to a GPU",
       {{"device", "D", "GPU to onload to, e.g. cuda:1 (default: the pipeline's)"}}},
      {"move",
       "NAME",
       1,
       1,
       "move a pipeline to another device, verified",
       {{"device", "D", "the device to move to: cpu or cuda:N (required)", FlagType::kString,
         true}}},
      {"policy",
       "NAME POLICY",
       2,
       2,
       "set a pipeline's offload policy: none, model, idle or sequential",
       {{"idle-seconds", "S", "idle: offload after S seconds without requests",
         FlagType::kNumber}}},
      {"empty-cache",
       "",
       0,
       0,
       "release the caching allocator's unused memory",
       {{"device", "D", "one device (default: every device)"}}},
      {"memory", "", 0, 0, "show device memory and per-component bytes of loaded pipelines", {}},
      {"snapshot",
       "",
       0,
       0,
       "save the GPUs' caching-allocator snapshot for PyTorch's memory visualizer",
       {{"out", "FILE", "where to write the snapshot (a pickle; required)", FlagType::kString,
         true}}},
      {"watch",
       "",
       0,
       0,
       "print memory events (load, unload, offload, onload, move, oom, leak, ...) as they happen",
       {{"after", "SEQ", "start after this event's sequence number (default: from now on)",
         FlagType::kUint},
        {"count", "N", "stop after N events (default: until interrupted)", FlagType::kUint}}},
      {"health",
       "",
       0,
       0,
       "check the server's health (grpc.health.v1)",
       {{"service", "NAME", "service to check (default: the whole server)"}}},
      {"bench",
       "",
       0,
       0,
       "load-test the server: throughput, latency, errors, memory; --out writes a report",
       {{"pipeline", "NAME", "pipeline of every request (or --mix)"},
        {"prompt", "TEXT", "the prompt (default: four built-in ones, in turn)"},
        {"negative", "TEXT", "negative prompt"},
        {"steps", "N", "denoising steps (default: the pipeline's)", FlagType::kUint32},
        {"width", "W", "image width (default: the pipeline's)", FlagType::kUint32},
        {"height", "H", "image height (default: the pipeline's)", FlagType::kUint32},
        {"guidance", "F", "guidance scale (default: the pipeline's)", FlagType::kNumber},
        {"num-images", "N", "images per request (default 1)", FlagType::kUint32},
        {"seed", "S", "the same seed for every request (default: the server picks)",
         FlagType::kUint},
        {"scheduler", "NAME",
         "ddim, euler, euler_a, dpmpp_2m[_sde][_karras], unipc[_karras] (default: the pipeline's)"},
        {"mix", "FILE", "weighted request templates, YAML or JSON, instead of the flags above"},
        {"concurrency", "N", "closed loop: requests kept in flight (default 8)", FlagType::kUint},
        {"rate", "R", "open loop: R requests/s, sent on schedule however many are in flight",
         FlagType::kNumber},
        {"arrivals", "KIND", "open loop: poisson (default) or uniform gaps"},
        {"requests", "N", "measured requests (default 100, or none with --duration)",
         FlagType::kUint},
        {"duration", "SECONDS", "measure for this long (with --requests: what ends first)",
         FlagType::kNumber},
        {"warmup", "N|Ns", "N requests, or N seconds, sent first and not counted (default 0)"},
        {"deadline", "SECONDS", "deadline of each request (default: --timeout, or none)",
         FlagType::kNumber},
        {"memory-interval", "SECONDS", "memory sample period (default 0.25; 0: events only)",
         FlagType::kNumber},
        {"random-seed", "N", "seed of the mix's picks and the Poisson gaps (default 0)",
         FlagType::kUint},
        {"out", "DIR", "write summary.json, requests.csv, memory.csv and report.html there"},
        {"label", "TEXT", "name of the run (default: the pipeline or the mix file)"}},
       "Latency runs from the time a request was due (open loop: its scheduled arrival), so a\n"
       "client falling behind shows as latency. With --server dns:///NAME:PORT (a Kubernetes\n"
       "headless Service) requests go round-robin to every address NAME resolves to, and the\n"
       "report counts them per pod. A mix file is a list of entries such as\n"
       "  - {name: small, weight: 3, pipeline: sd15, steps: 20, width: 512, height: 512}\n"
       "with the fields name, weight, pipeline, prompt or prompts, negative_prompt, steps,\n"
       "width, height, guidance, num_images, seed, scheduler and deadline.\n"
       "SIGINT or SIGTERM stops sending (a second one cancels the requests in flight) and\n"
       "still reports. Exit code 0 when at least one measured request succeeded.\n"},
  };
  return commands;
}

const CommandSpec* FindCommand(const std::string& name) {
  for (const CommandSpec& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

const FlagSpec* FindFlag(const std::vector<FlagSpec>& flags, const std::string& name) {
  for (const FlagSpec& f : flags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

bool ToUint(const std::string& text, uint64_t* out) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return false;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno != 0) return false;
  *out = static_cast<uint64_t>(v);
  return true;
}

// NaN and negatives are accepted: validating them is the server's job (and tested there).
bool ToDouble(const std::string& text, double* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE) return false;
  *out = v;
  return true;
}

// "" when `value` suits the flag's type, else the usage error.
std::string CheckValue(const FlagSpec& flag, const std::string& value) {
  uint64_t u = 0;
  double d = 0;
  if ((flag.type == FlagType::kUint || flag.type == FlagType::kUint32) && !ToUint(value, &u)) {
    return std::string("option '--") + flag.name + "' wants a non-negative integer, got '" + value +
           "'";
  }
  if (flag.type == FlagType::kUint32 && u > 0xffffffffu) {
    return std::string("option '--") + flag.name + "' is too large: " + value;
  }
  if (flag.type == FlagType::kNumber && !ToDouble(value, &d)) {
    return std::string("option '--") + flag.name + "' wants a number, got '" + value + "'";
  }
  return "";
}

bool ParseSeconds(const std::string& text, double* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(v) || v < 0) return false;
  *out = v;
  return true;
}

void AppendFlagHelp(std::ostringstream& os, const std::vector<FlagSpec>& flags) {
  for (const FlagSpec& f : flags) {
    std::string left = std::string("  --") + f.name;
    if (f.value_name != nullptr) left += std::string(" ") + f.value_name;
    os << left;
    os << std::string(left.size() < 28 ? 28 - left.size() : 1, ' ') << f.help << "\n";
  }
}

}  // namespace

std::string Usage(const std::string& command) {
  std::ostringstream os;
  const CommandSpec* spec = FindCommand(command);
  if (spec == nullptr) {
    os << "usage: qpool [global options] <command> [options]\n\n"
       << "Client of qpool-server, the text-to-image inference server.\n\ncommands:\n";
    for (const CommandSpec& c : Commands()) {
      std::string left = std::string("  ") + c.name;
      os << left << std::string(left.size() < 16 ? 16 - left.size() : 1, ' ') << c.summary << "\n";
    }
    os << "\nglobal options:\n";
    AppendFlagHelp(os, GlobalFlags());
    os << "\nRun 'qpool <command> --help' for a command's options.\n"
       << "exit codes: 0 ok, 1 server error, 2 usage error, 3 server unreachable\n";
    return os.str();
  }
  os << "usage: qpool [global options] " << spec->name;
  if (!spec->flags.empty()) os << " [options]";
  if (*spec->positional != '\0') os << " " << spec->positional;
  os << "\n\n" << spec->summary << "\n";
  if (!spec->flags.empty()) {
    os << "\noptions:\n";
    AppendFlagHelp(os, spec->flags);
  }
  if (spec->notes != nullptr) os << "\n" << spec->notes;
  os << "\nglobal options:\n";
  AppendFlagHelp(os, GlobalFlags());
  return os.str();
}

ParseResult Parse(int argc, const char* const* argv) {
  ParseResult result;
  ParsedArgs args;
  const char* env_server = std::getenv("QPOOL_SERVER");
  args.global.server =
      (env_server != nullptr && *env_server != '\0') ? env_server : "127.0.0.1:50051";
  const char* env_token = std::getenv("QPOOL_TOKEN_FILE");
  if (env_token != nullptr) args.global.token_file = env_token;
  const CommandSpec* spec = nullptr;
  bool options_done = false;

  auto fail = [&result](std::string message) {
    result.error = std::move(message);
    return result;
  };

  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (options_done || arg.size() < 2 || arg.compare(0, 2, "--") != 0 || arg == "--") {
      if (arg == "--" && !options_done) {
        options_done = true;
        continue;
      }
      if (spec == nullptr) {
        if (!arg.empty() && arg[0] == '-' && !options_done)
          return fail("unknown option '" + arg + "'");
        spec = FindCommand(arg);
        if (spec == nullptr) return fail("unknown command '" + arg + "'");
        args.command = spec->name;
      } else {
        if (!options_done && arg.size() > 1 && arg[0] == '-') {
          return fail("unknown option '" + arg + "'");
        }
        args.positional.push_back(arg);
      }
      continue;
    }
    // "--name" or "--name=value".
    std::string name = arg.substr(2);
    std::optional<std::string> inline_value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagSpec* flag = spec != nullptr ? FindFlag(spec->flags, name) : nullptr;
    const bool is_global = flag == nullptr;
    if (flag == nullptr) flag = FindFlag(GlobalFlags(), name);
    if (flag == nullptr) {
      return fail("unknown option '--" + name + "'" +
                  (spec != nullptr ? std::string(" for '") + spec->name + "'" : std::string()));
    }
    std::string value;
    if (flag->value_name != nullptr) {
      if (inline_value) {
        value = *inline_value;
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return fail("option '--" + name + "' needs a value (" + flag->value_name + ")");
      }
    } else if (inline_value) {
      return fail("option '--" + name + "' takes no value");
    }
    if (!is_global) {
      if (std::string error = CheckValue(*flag, value); !error.empty()) return fail(error);
      args.flags[name] = value;
    } else if (name == "help") {
      args.help = true;
    } else if (name == "json") {
      args.global.json = true;
    } else if (name == "server") {
      if (value.empty()) return fail("option '--server' needs HOST:PORT");
      args.global.server = value;
    } else if (name == "tls") {
      args.global.tls = true;
    } else if (name == "ca" || name == "cert" || name == "key" || name == "server-name" ||
               name == "token-file") {
      if (value.empty()) return fail("option '--" + name + "' needs a value");
      (name == "ca"            ? args.global.ca_file
       : name == "cert"        ? args.global.cert_file
       : name == "key"         ? args.global.key_file
       : name == "server-name" ? args.global.server_name
                               : args.global.token_file) = value;
      if (name != "token-file") args.global.tls = true;
    } else if (name == "timeout" || name == "connect-timeout") {
      double seconds = 0;
      if (!ParseSeconds(value, &seconds)) {
        return fail("option '--" + name + "' wants a number of seconds >= 0, got '" + value + "'");
      }
      (name == "timeout" ? args.global.timeout_seconds : args.global.connect_timeout_seconds) =
          seconds;
    }
  }

  if (args.global.cert_file.empty() != args.global.key_file.empty()) {
    return fail("options '--cert' and '--key' go together");
  }
  if (spec == nullptr) {
    if (args.help) {
      result.args = std::move(args);
      return result;
    }
    return fail("no command given");
  }
  if (!args.help) {
    for (const FlagSpec& f : spec->flags) {
      if (f.required && args.flags.count(f.name) == 0) {
        return fail(std::string("option '--") + f.name + "' is required");
      }
    }
    const int n = static_cast<int>(args.positional.size());
    if (n < spec->min_positional) {
      return fail(std::string("'") + spec->name + "' needs " + spec->positional);
    }
    if (spec->max_positional >= 0 && n > spec->max_positional) {
      return fail(std::string("unexpected argument '") + args.positional[spec->max_positional] +
                  "' for '" + spec->name + "'");
    }
  }
  result.args = std::move(args);
  return result;
}

std::optional<std::string> GetString(const ParsedArgs& args, const std::string& flag) {
  const auto it = args.flags.find(flag);
  if (it == args.flags.end()) return std::nullopt;
  return it->second;
}

std::optional<uint64_t> GetUint(const ParsedArgs& args, const std::string& flag) {
  const std::optional<std::string> text = GetString(args, flag);
  if (!text) return std::nullopt;
  uint64_t v = 0;
  if (!ToUint(*text, &v)) {
    throw UsageError{"option '--" + flag + "' wants a non-negative integer, got '" + *text + "'"};
  }
  return v;
}

std::optional<double> GetDouble(const ParsedArgs& args, const std::string& flag) {
  const std::optional<std::string> text = GetString(args, flag);
  if (!text) return std::nullopt;
  double v = 0;
  if (!ToDouble(*text, &v))
    throw UsageError{"option '--" + flag + "' wants a number, got '" + *text + "'"};
  return v;
}

}  // namespace qpool::cli
