// fuzz_server_options: ParseServerOptions on a command line made from the input, split at NUL
// bytes into arguments after "qpool-server" (the seeds are real flag lines). Only OK,
// INVALID_ARGUMENT and, for --help and --version, CANCELLED may come back; parsed options must be
// inside the ranges the flags document.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/server_options.h"
#include "fuzz_check.h"

namespace qpool::fuzz {
namespace {

void CheckOptions(const ServerOptions& o) {
  FUZZ_CHECK(o.memory_budget > 0 && o.memory_budget <= 1, "memory_budget");
  FUZZ_CHECK(
      o.host_memory_budget_bytes > 0 || (o.host_memory_budget > 0 && o.host_memory_budget <= 1),
      "host_memory_budget");
  FUZZ_CHECK(o.max_queue >= 1 && o.max_queue <= 100000, "max_queue");
  FUZZ_CHECK(o.max_message_mb >= 1 && o.max_message_mb <= 2047, "max_message_mb");
  FUZZ_CHECK(o.max_watchers >= 0 && o.max_watchers <= 100000, "max_watchers");
  FUZZ_CHECK(o.drain_seconds >= 0 && o.drain_seconds <= 3600, "drain_seconds");
  FUZZ_CHECK(o.cpu_threads >= 0 && o.cpu_threads <= 1024, "cpu_threads");
  FUZZ_CHECK(o.tls_reload_seconds >= 1 && o.tls_reload_seconds <= 86400, "tls_reload_seconds");
  FUZZ_CHECK(o.tls_cert.empty() == o.tls_key.empty(), "--tls-cert without --tls-key");
  FUZZ_CHECK(o.tls_client_ca.empty() || !o.tls_cert.empty(), "--tls-client-ca without TLS");
  FUZZ_CHECK(o.admin_clients.empty() || !o.tls_client_ca.empty(), "--admin-clients without mTLS");
  for (const std::string& name : o.protect) {
    FUZZ_CHECK(name == "admin" || name == "inference" || name == "read", "--protect " + name);
  }
  for (const std::vector<std::string>* list : {&o.load, &o.admin_clients}) {
    for (const std::string& item : *list) {
      FUZZ_CHECK(!item.empty() && item.find(',') == std::string::npos, "comma list item");
    }
  }
  // Both addresses are looked at at start-up (metrics TLS "auto", the credentials warning).
  (void)IsLoopbackListen(o.listen);
  (void)IsLoopbackListen(o.metrics_listen);
}

}  // namespace
}  // namespace qpool::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qpool;
  // argv as main() gets it: NUL-terminated strings, argv[argc] == nullptr.
  std::vector<std::string> args = {"qpool-server"};
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\0') {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (size > 0) args.push_back(current);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const StatusOr<ServerOptions> o =
      ParseServerOptions(static_cast<int>(args.size()), argv.data(), "0.0.0-fuzz");
  if (o.ok()) {
    fuzz::CheckOptions(*o);
    return 0;
  }
  const StatusCode code = o.status().code();
  FUZZ_CHECK(code == StatusCode::kInvalidArgument || code == StatusCode::kCancelled,
             o.status().ToString());
  FUZZ_CHECK(!o.status().message().empty(), "an error without a message");
  return 0;
}
