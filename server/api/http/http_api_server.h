// HttpApiServer: the OpenAI images API over HTTP/JSON (--http-listen), on libmicrohttpd, in
// front of the same PipelinePool as gRPC: POST /v1/images/generations, GET /v1/models and the
// health endpoints (Note [OpenAI images edge] in api/http/openai_images.h).
//
// Thread safety: Start and Stop may be called from any thread. Requests are read on
// libmicrohttpd's threads; a generation is handed to the pool there and its connection suspended
// until the pool's OnReply (on a device worker) resumes it with the reply (Note [HTTP requests]).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "pool/pipeline_pool.h"
#include "util/status.h"

struct MHD_Daemon;

namespace qpool::api::http {

struct HttpApiOptions {
  // Bearer tokens, the file gRPC's calls are checked against (--admin-token-file); empty = none.
  std::string token_file;
  // Whether generations and the model list need a token (--protect inference, read).
  bool protect_inference = false;
  bool protect_read = false;
  // A PEM certificate chain and key: HTTPS only (the gRPC port's --tls-cert and --tls-key).
  std::optional<std::pair<std::string, std::string>> tls;
  // False while the server drains (Note [Drain] in main.cpp): /health/ready answers 503.
  std::function<bool()> ready = [] { return true; };
};

class HttpRequest;  // one request's state (http_api_server.cpp)

class HttpApiServer {
 public:
  // Note [HTTP requests]
  // - A request's body is read into memory up to kMaxBodyBytes (a prompt and a few numbers need
  //   far less); past it the reply is 413 and the rest is not read. POST bodies must be
  //   application/json (415 otherwise).
  // - A generation suspends its connection (no thread waits for it) and the pool's OnReply
  //   resumes it; a streamed one (Note [Image events]) suspends it whenever every event so far
  //   is sent, and the next event resumes it. A watcher thread polls the suspended connections'
  //   sockets every kWatchMs and marks a request whose client hung up as cancelled, which the
  //   pool sees between denoising steps (GenerateListener::Cancelled), as it sees a cancelled
  //   gRPC call; a connection libmicrohttpd closes (a failed write) cancels its request too.
  // - Connections: at most kConnectionLimit open; one without a byte for kIdleSeconds (and not
  //   waiting for its generation) is closed.
  // - Stop cancels the generations still running, waits for their replies, then stops the
  //   daemon (which needs no connection suspended).
  static constexpr size_t kMaxBodyBytes = size_t{1} << 20;
  static constexpr unsigned kThreads = 4;
  static constexpr unsigned kConnectionLimit = 2048;
  static constexpr unsigned kIdleSeconds = 60;
  static constexpr int kWatchMs = 100;

  // Listens on `listen` ("HOST:PORT", port 0 picks one) and serves `pool`, which must outlive
  // the server. InvalidArgument for a malformed address or a token file that cannot be read,
  // Unavailable when the address cannot be bound.
  static StatusOr<std::unique_ptr<HttpApiServer>> Start(const std::string& listen,
                                                        PipelinePool& pool, HttpApiOptions options);
  ~HttpApiServer();
  HttpApiServer(const HttpApiServer&) = delete;
  HttpApiServer& operator=(const HttpApiServer&) = delete;

  // "HOST:PORT" with HOST numeric.
  const std::string& address() const { return address_; }
  // Cancels running generations, waits for them, closes the port; idempotent.
  void Stop();

  struct Internals;  // what libmicrohttpd's threads share (http_api_server.cpp)

 private:
  HttpApiServer() = default;

  std::unique_ptr<Internals> internals_;
  std::mutex stop_mu_;  // serializes Stop
  MHD_Daemon* daemon_ = nullptr;
  std::string address_;
};

}  // namespace qpool::api::http
