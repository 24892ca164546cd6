// qpool: command-line client of qpool-server. See `qpool --help` and cli_args.cpp for the
// commands; exit codes are listed in cli_args.h (ExitCode).
#include <iostream>
#include <map>

#include "cli_args.h"
#include "commands.h"
#include "connection.h"

namespace {

using qpool::cli::Connection;
using qpool::cli::ParsedArgs;

using CommandFn = int (*)(const ParsedArgs&, const Connection&);
using CheckFn = void (*)(const ParsedArgs&);

const std::map<std::string, CommandFn>& CommandTable() {
  static const std::map<std::string, CommandFn> table = {
      {"generate", qpool::cli::RunGenerate},
      {"encode", qpool::cli::RunEncode},
      {"list", qpool::cli::RunList},
      {"load", qpool::cli::RunLoad},
      {"unload", qpool::cli::RunUnload},
      {"memory", qpool::cli::RunMemory},
      {"health", qpool::cli::RunHealth},
      {"bench", qpool::cli::RunBench},
      {"offload", qpool::cli::RunOffload},
      {"onload", qpool::cli::RunOnload},
      {"move", qpool::cli::RunMove},
      {"policy", qpool::cli::RunPolicy},
      {"empty-cache", qpool::cli::RunEmptyCache},
      {"watch", qpool::cli::RunWatch},
      {"snapshot", qpool::cli::RunSnapshot},
  };
  return table;
}

// Checks that read files or combine flags, made before connecting (a command without one
// relies on Parse()).
const std::map<std::string, CheckFn>& CheckTable() {
  static const std::map<std::string, CheckFn> table = {{"bench", qpool::cli::CheckBench}};
  return table;
}

int UsageFailure(const std::string& command, const std::string& message) {
  std::cerr << "qpool: " << message << "\n\n" << qpool::cli::Usage(command);
  return qpool::cli::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  const qpool::cli::ParseResult parsed = qpool::cli::Parse(argc, argv);
  if (!parsed.args) {
    // Show the command's usage when the command itself was recognised.
    std::string command;
    for (int i = 1; i < argc && command.empty(); ++i) {
      if (CommandTable().count(argv[i]) != 0) command = argv[i];
    }
    return UsageFailure(command, parsed.error);
  }
  const ParsedArgs& args = *parsed.args;
  if (args.help) {
    std::cout << qpool::cli::Usage(args.command);
    return qpool::cli::kExitOk;
  }
  const CommandFn run = CommandTable().at(args.command);
  try {
    // Parse() already checked flag types and required flags, so a usage error never waits on
    // the network; the typed getters still throw UsageError for anything it let through.
    if (const auto check = CheckTable().find(args.command); check != CheckTable().end()) {
      check->second(args);
    }
    Connection connection(args.global);
    if (!connection.Connect()) return qpool::cli::kExitUnreachable;
    return run(args, connection);
  } catch (const qpool::cli::UsageError& error) {
    return UsageFailure(args.command, error.message);
  }
}
