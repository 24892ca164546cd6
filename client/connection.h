// The CLI's channel to qpool-server: connects once, sets deadlines, and turns a failed RPC
// into the CLI's message and exit code.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "cli_args.h"

namespace qpool::cli {

class Connection {
 public:
  // Reads the TLS and token files the options name; throws UsageError naming a file that cannot
  // be read or holds no token. A dns:, ipv4: or ipv6: server address balances calls round-robin
  // over every address it names (Note [Balancing over a Service] in connection.cpp).
  explicit Connection(const GlobalOptions& options);

  // Waits until the channel is READY. On failure prints "cannot reach qpool-server at
  // HOST:PORT" (plus the reason) to stderr and returns false.
  bool Connect();

  // Sets the --timeout deadline (if any) and the bearer token (if any) on a context of an RPC
  // about to start.
  void Prepare(grpc::ClientContext* context) const;

  // Prints a failed status to stderr and returns the exit code: kExitUnreachable for
  // UNAVAILABLE ("qpool-server at ... is unavailable: <message>", e.g. while it drains), else
  // kExitRpcError ("error: <CODE>: <message>").
  int Fail(const grpc::Status& status) const;

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  const std::string& target() const { return options_.server; }

 private:
  GlobalOptions options_;
  std::string token_;  // "" without --token-file
  std::shared_ptr<grpc::Channel> channel_;
};

// "INVALID_ARGUMENT" for grpc::StatusCode::INVALID_ARGUMENT, etc.
const char* StatusCodeName(grpc::StatusCode code);

}  // namespace qpool::cli
