// Command-line parsing for the `qpool` CLI: global options, one command, its flags and
// positional arguments. Hand-written (no extra dependency); the command table lives in
// cli_args.cpp and also drives the help text.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace qpool::cli {

// Process exit codes; scripts and the integration tests rely on them.
enum ExitCode : int {
  kExitOk = 0,
  kExitRpcError = 1,     // the server answered with an error status
  kExitUsage = 2,        // bad command line; usage text on stderr
  kExitUnreachable = 3,  // no connection to the server
};

// Options that apply to every command.
struct GlobalOptions {
  std::string server;            // HOST:PORT; default $QPOOL_SERVER or 127.0.0.1:50051
  bool json = false;             // one JSON document on stdout instead of human text
  double timeout_seconds = 0;    // RPC deadline; 0 = none
  double connect_timeout_seconds = 10;  // how long to wait for the connection
  // TLS (docs/security.md): on with --tls or any of the files below.
  bool tls = false;
  std::string ca_file;      // PEM roots that verify the server (default: the system's)
  std::string cert_file;    // PEM client certificate chain (mTLS), with key_file
  std::string key_file;     // its PEM private key
  std::string server_name;  // name the server certificate must carry (default: HOST)
  // Bearer token for protected calls: the first token line of this file (default
  // $QPOOL_TOKEN_FILE).
  std::string token_file;
};

// A parsed command line. Flags are kept as strings; commands convert them with the typed
// getters below, which report a usage error for malformed values.
struct ParsedArgs {
  GlobalOptions global;
  std::string command;                       // "" when only --help was given
  std::map<std::string, std::string> flags;  // command flags without "--"; "" for switches
  std::vector<std::string> positional;
  bool help = false;                         // --help given (global or for the command)
};

// Result of Parse: either args or a usage error message (never both).
struct ParseResult {
  std::optional<ParsedArgs> args;
  std::string error;
};

// Parses argv (argv[0] is skipped). Global options may appear before or after the command.
ParseResult Parse(int argc, const char* const* argv);

// The help text: the overview without a command, else that command's usage.
std::string Usage(const std::string& command);

// Thrown by the typed getters for a malformed or out-of-range flag value; main() prints it
// with the command's usage and exits with kExitUsage. Never escapes the CLI process.
struct UsageError {
  std::string message;
};

// Typed access to flags of a ParsedArgs; absent flag -> std::nullopt.
std::optional<std::string> GetString(const ParsedArgs& args, const std::string& flag);
std::optional<uint64_t> GetUint(const ParsedArgs& args, const std::string& flag);
std::optional<double> GetDouble(const ParsedArgs& args, const std::string& flag);

}  // namespace qpool::cli
