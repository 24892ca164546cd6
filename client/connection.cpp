#include "connection.h"

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

namespace qpool::cli {
namespace {

std::chrono::system_clock::time_point After(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(seconds));
}

// Generate responses carry PNGs; allow large results (16 images of 1024x1024 fit easily).
constexpr int kMaxReceiveBytes = 512 * 1024 * 1024;

std::string ReadFileOrThrow(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError{"cannot read " + flag + " file '" + path + "'"};
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The first line of a token file that is neither blank nor a '#' comment, trimmed: the server
// reads the same format (one token per line).
std::string FirstToken(const std::string& path) {
  std::istringstream lines(ReadFileOrThrow("--token-file", path));
  std::string line;
  while (std::getline(lines, line)) {
    const auto begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos || line[begin] == '#') continue;
    const auto end = line.find_last_not_of(" \t\r");
    return line.substr(begin, end - begin + 1);
  }
  throw UsageError{"token file '" + path + "' holds no token"};
}

}  // namespace

Connection::Connection(const GlobalOptions& options) : options_(options) {
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options_.tls) {
    grpc::SslCredentialsOptions ssl;
    if (!options_.ca_file.empty()) ssl.pem_root_certs = ReadFileOrThrow("--ca", options_.ca_file);
    if (!options_.cert_file.empty()) {
      ssl.pem_cert_chain = ReadFileOrThrow("--cert", options_.cert_file);
      ssl.pem_private_key = ReadFileOrThrow("--key", options_.key_file);
    }
    credentials = grpc::SslCredentials(ssl);
    if (!options_.server_name.empty()) {
      channel_args.SetSslTargetNameOverride(options_.server_name);
    }
  }
  if (!options_.token_file.empty()) token_ = FirstToken(options_.token_file);
  // Note [Balancing over a Service]
  // A dns:/// target may resolve to several servers: the pods behind a Kubernetes headless
  // Service (an ipv4:/ipv6: target may list several too). gRPC's default policy, pick_first,
  // would send every call to one of them; round_robin spreads calls over all that are
  // connected, which is what `qpool bench` needs to load a whole Service. It is the channel's
  // default service config, so a config the resolver supplies still wins. A target without a
  // scheme (HOST:PORT) keeps pick_first.
  if (options_.server.rfind("dns:", 0) == 0 || options_.server.rfind("ipv4:", 0) == 0 ||
      options_.server.rfind("ipv6:", 0) == 0) {
    channel_args.SetServiceConfigJSON(R"({"loadBalancingConfig": [{"round_robin": {}}]})");
  }
  channel_ = grpc::CreateCustomChannel(options_.server, credentials, channel_args);
}

// Note [Unreachable fails fast]
// WaitForConnected() would keep retrying (with backoff) until the deadline, so a server that
// is simply not running would cost the whole connect timeout. We watch the state instead and
// give up at the first TRANSIENT_FAILURE: the resolver tried every address and each failed.
// The connect timeout bounds the slow cases (a black-holed address, slow DNS).
bool Connection::Connect() {
  const auto deadline = After(options_.connect_timeout_seconds);
  grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) {
      std::cerr << "cannot reach qpool-server at " << options_.server
                << " (connection failed; is the server running?"
                << (options_.tls ? " Does it serve TLS, does its certificate verify with --ca and "
                                   "carry --server-name, and does it need --cert/--key?"
                                 : " If it serves TLS, pass --tls or --ca.")
                << ")\n";
      return false;
    }
    if (!channel_->WaitForStateChange(state, deadline)) {
      std::cerr << "cannot reach qpool-server at " << options_.server << " (no connection after "
                << options_.connect_timeout_seconds << " s)\n";
      return false;
    }
    state = channel_->GetState(/*try_to_connect=*/true);
  }
  return true;
}

void Connection::Prepare(grpc::ClientContext* context) const {
  if (options_.timeout_seconds > 0) context->set_deadline(After(options_.timeout_seconds));
  if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
}

int Connection::Fail(const grpc::Status& status) const {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    // Connected, then UNAVAILABLE: the server is draining, stopping, or moving the pipeline.
    std::cerr << "qpool-server at " << options_.server << " is unavailable: "
              << status.error_message() << "\n";
    return kExitUnreachable;
  }
  std::cerr << "error: " << StatusCodeName(status.error_code()) << ": " << status.error_message()
            << "\n";
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED && token_.empty()) {
    std::cerr << "hint: pass a bearer token with --token-file FILE (or $QPOOL_TOKEN_FILE)\n";
  }
  return kExitRpcError;
}

const char* StatusCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

}  // namespace qpool::cli
