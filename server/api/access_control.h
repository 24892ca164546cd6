// AccessControl: which calls need credentials, and whether a call's credentials are good.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "metrics/metrics_registry.h"
#include "util/token_file.h"

namespace qpool::api {

// The classes of qpool's RPCs, as --protect names them.
enum class CallClass {
  kAdmin,      // load, unload, offload, onload, move, policy, empty cache, allocator snapshot
  kInference,  // Generate, Encode
  kRead,       // ListPipelines, GetMemoryReport, WatchMemory
};

// "admin", "inference", "read".
const char* CallClassName(CallClass c);

struct AccessOptions {
  // Bearer tokens (Note [Bearer tokens] in util/token_file.h); empty = none.
  std::string token_file;
  // Client certificate identities (subject CN, or a DNS or URI subject alternative name) whose
  // calls are authorized; needs client certificates verified by the TLS layer (mTLS).
  std::vector<std::string> allowed_clients;
  // The classes that need credentials; admin is always among them (Create adds it). Health
  // checking and reflection are never protected: probes and load balancers carry none.
  std::set<CallClass> protect = {CallClass::kAdmin};
};

// Note [Admin credentials]
// A call of a protected class passes with either credential:
//   - `authorization: Bearer <token>` metadata holding a token of --admin-token-file; a token that
//     is present but not valid is UNAUTHENTICATED, whatever certificate came with it;
//   - a client certificate, verified by TLS against --tls-client-ca, whose subject CN (when the
//     subject has exactly one: two would be ambiguous) or one of whose DNS or URI subject
//     alternative names is on --admin-clients (e-mail and IP SANs name no client); a verified
//     certificate that is not on the list, or a CA certificate presented as a client's, is
//     PERMISSION_DENIED (the client is known, the call is not its to make). The list is read at
//     start-up, and no CRL is read: to revoke a client, take it off the list and restart, or
//     rotate the client CA.
// A call with neither is UNAUTHENTICATED. Admin calls are always protected once a credential is
// configured (--protect adds inference and read to them, it cannot take admin away). Without any
// credential configured nothing is protected, and the server says so at error level at start-up
// when it listens beyond loopback that way. Every refusal is
// counted in qpool_denied_calls_total{class, code} and logged at debug level only, so a client
// hammering with bad tokens cannot flood the log. Checks run on the gRPC thread before the
// request is converted or handed to the pool: a refused call costs no pool work.
class AccessControl {
 public:
  // Opens the token file (if any). InvalidArgument for a protected class without any credential
  // configured; the token file's errors as they are. `metrics` may be null.
  static StatusOr<std::unique_ptr<AccessControl>> Create(const AccessOptions& options,
                                                         MetricsRegistry* metrics);

  // OK, UNAUTHENTICATED or PERMISSION_DENIED for a call of `call_class` to `method` (its name,
  // for the message). Thread safety: safe from any thread.
  grpc::Status Check(const grpc::CallbackServerContext& context, CallClass call_class,
                     const char* method) const;

  // True when some class is protected (credentials are configured).
  bool enabled() const { return enabled_; }

 private:
  AccessControl(const AccessOptions& options, std::unique_ptr<TokenFile> tokens,
                MetricsRegistry* metrics);
  grpc::Status Deny(CallClass call_class, grpc::StatusCode code, std::string message,
                    const grpc::CallbackServerContext& context) const;

  const std::set<CallClass> protect_;
  const std::set<std::string> allowed_clients_;
  const std::unique_ptr<TokenFile> tokens_;
  const bool enabled_;
  CounterFamily* denied_ = nullptr;
};

}  // namespace qpool::api
