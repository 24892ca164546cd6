#include "api/http/http_api_server.h"

#include <microhttpd.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <set>
#include <thread>
#include <vector>

#include "api/http/openai_images.h"
#include "util/listen_socket.h"
#include "util/log.h"
#include "util/token_file.h"

namespace qpool::api::http {

struct HttpApiServer::Internals {
  Internals(PipelinePool& p, HttpApiOptions o) : pool(p), options(std::move(o)) {}
  PipelinePool& pool;
  const HttpApiOptions options;
  std::unique_ptr<TokenFile> tokens;
  std::mutex mu;  // guards running, stopping
  std::condition_variable idle;
  std::set<std::shared_ptr<HttpRequest>> running;  // generations the pool has not answered
  bool stopping = false;
  std::atomic<bool> stop_watch{false};
  std::thread watcher;
};

// One request: its body as it arrives and, for a generation, the listener the pool answers
// (Note [HTTP requests]): a whole reply (code, reply) once done, or with `stream` the events
// written so far (Note [Image events]), which ReadEvents hands to libmicrohttpd.
class HttpRequest final : public GenerateListener {
 public:
  HttpRequest(MHD_Connection* connection, HttpApiServer::Internals& server)
      : connection_(connection), server_(server) {}

  std::string body;
  bool started = false;  // handed to the pool (or answered)
  int code = 0;          // the reply, once done (without stream, or refused at once)
  std::string reply;

  // Hands `call` to the pool; `self` keeps this alive until OnReply. Returns whether the reply
  // is still to come; false if it is already here (a call refused at once). Without `stream`,
  // the connection is then suspended until OnReply; with it, the caller queues the event
  // stream.
  bool Run(GenerateCall call, std::shared_ptr<HttpRequest> self, bool stream) {
    const MHD_ConnectionInfo* info =
        MHD_get_connection_info(connection_, MHD_CONNECTION_INFO_CONNECTION_FD);
    fd_ = info != nullptr ? info->connect_fd : -1;
    stream_ = stream;
    {
      std::lock_guard<std::mutex> lock(server_.mu);
      if (server_.stopping) {
        Answer(Unavailable("the server is stopping"));
        return false;
      }
      server_.running.insert(self);
    }
    self_ = std::move(self);
    server_.pool.Generate(std::move(call), this);
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return false;  // refused at once: a plain error reply, even with stream
    if (!stream_) {
      MHD_suspend_connection(connection_);
      suspended_ = true;
    }
    return true;
  }

  // libmicrohttpd's content reader of the event stream: the events not yet sent, the end once
  // the reply's are, or (none ready) 0 with the connection suspended until the next event.
  ssize_t ReadEvents(char* buf, size_t max) {
    std::lock_guard<std::mutex> lock(mu_);
    if (sent_ < events_.size()) {
      const size_t n = std::min(max, events_.size() - sent_);
      std::memcpy(buf, events_.data() + sent_, n);
      sent_ += n;
      if (sent_ == events_.size()) {
        events_.clear();
        sent_ = 0;
      }
      return static_cast<ssize_t>(n);
    }
    if (done_) return MHD_CONTENT_READER_END_OF_STREAM;
    MHD_suspend_connection(connection_);
    suspended_ = true;
    return 0;
  }

  // The socket of a connection waiting for its generation, or -1 (server mu held).
  int WaitingFd() {
    std::lock_guard<std::mutex> lock(mu_);
    return suspended_ ? fd_ : -1;
  }
  void Cancel() { cancelled_ = true; }

  // GenerateListener
  void OnProgress(int step, int total, double elapsed_seconds) override {
    if (stream_) Push(ProgressEvent(step, total, elapsed_seconds), false);
  }
  bool Cancelled() const override { return cancelled_.load(); }
  void OnReply(StatusOr<GenerateReply> result) override {
    // The whole reply, or with stream its events (and, for a refusal before the stream began,
    // the error reply Run returns instead).
    std::string events;
    const int64_t now = std::time(nullptr);
    if (!result.ok()) {
      Answer(result.status());
      if (stream_) events = ErrorEvent(result.status());
    } else if (stream_) {
      events = CompletedEvents(std::move(result).value(), now);
    } else {
      code = 200;
      reply = ImagesResponseJson(std::move(result).value(), now);
    }
    std::shared_ptr<HttpRequest> self = std::move(self_);  // this lives until the end here
    {
      // Out of `running` before the resume: the watcher polls no socket that may close.
      std::lock_guard<std::mutex> lock(server_.mu);
      server_.running.erase(self);
      if (server_.running.empty()) server_.idle.notify_all();
    }
    Push(std::move(events), true);
  }

  // libmicrohttpd is done with the connection: nothing may resume it from now on.
  void Closed() {
    cancelled_ = true;
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }

  void Answer(const Status& status) {
    code = HttpCodeOf(status.code());
    reply = ErrorJson(status);
  }

 private:
  // Appends `events` (and with `last`, ends the reply), resuming the connection if it waits.
  void Push(std::string events, bool last) {
    std::lock_guard<std::mutex> lock(mu_);
    events_ += events;
    done_ = done_ || last;
    if (suspended_ && !closed_) {
      suspended_ = false;
      MHD_resume_connection(connection_);
    }
  }

  MHD_Connection* const connection_;
  HttpApiServer::Internals& server_;
  std::shared_ptr<HttpRequest> self_;
  std::atomic<bool> cancelled_{false};
  bool stream_ = false;  // set before the pool has the request
  std::mutex mu_;        // guards everything below; code and reply are read after done_
  bool done_ = false;
  bool suspended_ = false;
  bool closed_ = false;
  std::string events_;  // not yet sent (sent_ of them are)
  size_t sent_ = 0;
  int fd_ = -1;
};

namespace {

constexpr char kJson[] = "application/json";

void LogFromMhd(void* /*cls*/, const char* format, va_list args) {
  char buffer[512];
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  std::string message(buffer);
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r')) message.pop_back();
  log::Warn("http api: ", message);
}

MHD_Result Reply(MHD_Connection* connection, int code, const std::string& body,
                 const char* allow = nullptr) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, kJson);
  if (allow != nullptr) MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, allow);
  if (code == 401) MHD_add_response_header(response, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
  if (code == 429 || code == 503) MHD_add_response_header(response, "Retry-After", "1");
  const MHD_Result result = MHD_queue_response(connection, static_cast<unsigned>(code), response);
  MHD_destroy_response(response);
  return result;
}

MHD_Result ReplyError(MHD_Connection* connection, const Status& status,
                      const char* allow = nullptr) {
  return Reply(connection, HttpCodeOf(status.code()), ErrorJson(status), allow);
}

// OK, or UNAUTHENTICATED when the class of call is protected and the request carries no
// accepted `Authorization: Bearer` token (Note [Admin credentials] in api/access_control.h).
Status Authorize(HttpApiServer::Internals& server, MHD_Connection* connection, bool protect) {
  if (!protect) return Status::Ok();
  const char* header =
      MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  constexpr char kBearer[] = "Bearer ";
  if (header == nullptr || std::strncmp(header, kBearer, sizeof(kBearer) - 1) != 0) {
    return Status(StatusCode::kUnauthenticated, "this call needs 'Authorization: Bearer <token>'");
  }
  if (server.tokens == nullptr || !server.tokens->Accepts(header + sizeof(kBearer) - 1)) {
    return Status(StatusCode::kUnauthenticated, "the bearer token is not valid");
  }
  return Status::Ok();
}

// Note [Image events]: the reply as it is made, chunked, read by HttpRequest::ReadEvents.
MHD_Result QueueEvents(MHD_Connection* connection, const std::shared_ptr<HttpRequest>& request) {
  using Held = std::shared_ptr<HttpRequest>;
  MHD_Response* response = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 16 << 10,
      [](void* cls, uint64_t, char* buf, size_t max) {
        return (*static_cast<Held*>(cls))->ReadEvents(buf, max);
      },
      new Held(request), [](void* cls) { delete static_cast<Held*>(cls); });
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
  MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  const MHD_Result result = MHD_queue_response(connection, MHD_HTTP_OK, response);
  MHD_destroy_response(response);
  return result;
}

MHD_Result Generations(HttpApiServer::Internals& server, MHD_Connection* connection,
                       const std::shared_ptr<HttpRequest>& request) {
  HttpRequest& r = *request;
  if (!r.started) {
    r.started = true;
    const Status allowed = Authorize(server, connection, server.options.protect_inference);
    if (!allowed.ok()) return ReplyError(connection, allowed);
    StatusOr<ImagesRequest> parsed = ParseImagesRequest(r.body);
    if (!parsed.ok()) return ReplyError(connection, parsed.status());
    const bool stream = parsed->stream;
    if (r.Run(std::move(parsed->call), request, stream)) {
      return stream ? QueueEvents(connection, request) : MHD_YES;  // resumed with the reply
    }
  }
  return Reply(connection, r.code, r.reply);
}

MHD_Result Route(HttpApiServer::Internals& server, MHD_Connection* connection,
                 const std::string& path, const std::string& method,
                 const std::shared_ptr<HttpRequest>& request) {
  const bool get = method == MHD_HTTP_METHOD_GET;
  if (path == "/v1/images/generations") {
    if (method != MHD_HTTP_METHOD_POST) {
      return Reply(connection, 405, ErrorJson(InvalidArgument("use POST")), "POST");
    }
    return Generations(server, connection, request);
  }
  if (path == "/v1/models" || path == "/health/live" || path == "/health/ready") {
    if (!get) return Reply(connection, 405, ErrorJson(InvalidArgument("use GET")), "GET");
    if (!request->body.empty()) return ReplyError(connection, InvalidArgument("a GET has no body"));
    if (path == "/health/live") return Reply(connection, 200, R"({"status":"ok"})");
    if (path == "/health/ready") {
      return server.options.ready() ? Reply(connection, 200, R"({"status":"ready"})")
                                    : Reply(connection, 503, R"({"status":"draining"})");
    }
    const Status allowed = Authorize(server, connection, server.options.protect_read);
    if (!allowed.ok()) return ReplyError(connection, allowed);
    return Reply(connection, 200, ModelsJson(server.pool.List(), std::time(nullptr)));
  }
  return ReplyError(connection, NotFound(StrCat("no endpoint ", path, " (docs/http-api.md)")));
}

std::string TooLarge() {
  return ErrorJson(
      InvalidArgument(StrCat("the body is larger than ", HttpApiServer::kMaxBodyBytes, " bytes")));
}

MHD_Result HandleRequest(void* cls, MHD_Connection* connection, const char* url, const char* method,
                         const char* /*version*/, const char* upload_data, size_t* upload_data_size,
                         void** state) {
  auto& server = *static_cast<HttpApiServer::Internals*>(cls);
  if (*state == nullptr) {
    const char* length =
        MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    *state = new std::shared_ptr<HttpRequest>(std::make_shared<HttpRequest>(connection, server));
    if (length != nullptr && std::strtoull(length, nullptr, 10) > HttpApiServer::kMaxBodyBytes) {
      return Reply(connection, 413, TooLarge());
    }
    if (std::strcmp(method, MHD_HTTP_METHOD_POST) == 0) {
      const char* type =
          MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
      if (type == nullptr || std::strncmp(type, kJson, sizeof(kJson) - 1) != 0) {
        return Reply(connection, 415,
                     ErrorJson(InvalidArgument("the body must be application/json")));
      }
    }
    return MHD_YES;
  }
  const std::shared_ptr<HttpRequest>& request = *static_cast<std::shared_ptr<HttpRequest>*>(*state);
  if (*upload_data_size != 0) {
    if (request->body.size() + *upload_data_size > HttpApiServer::kMaxBodyBytes) {
      *upload_data_size = 0;
      return Reply(connection, 413, TooLarge());
    }
    request->body.append(upload_data, *upload_data_size);
    *upload_data_size = 0;
    return MHD_YES;
  }
  try {  // no exception crosses into libmicrohttpd's thread
    return Route(server, connection, url, method, request);
  } catch (const std::exception& e) {
    log::Error("http api: ", method, " ", url, " failed: ", e.what());
    return ReplyError(connection, Internal("the request failed; see the server's log"));
  }
}

void RequestCompleted(void* /*cls*/, MHD_Connection* /*connection*/, void** state,
                      MHD_RequestTerminationCode /*code*/) {
  if (*state == nullptr) return;
  auto* request = static_cast<std::shared_ptr<HttpRequest>*>(*state);
  (*request)->Closed();  // a generation still running for it stops at its next step
  delete request;
  *state = nullptr;
}

// Note [HTTP requests]: marks the generations whose client hung up as cancelled.
void WatchHangUps(HttpApiServer::Internals& server) {
  while (!server.stop_watch.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(HttpApiServer::kWatchMs));
    std::lock_guard<std::mutex> lock(server.mu);
    std::vector<pollfd> fds;
    std::vector<HttpRequest*> requests;
    for (const auto& r : server.running) {
      const int fd = r->WaitingFd();
      if (fd < 0) continue;
      fds.push_back({fd, POLLRDHUP, 0});
      requests.push_back(r.get());
    }
    if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) requests[i]->Cancel();
    }
  }
}

}  // namespace

StatusOr<std::unique_ptr<HttpApiServer>> HttpApiServer::Start(const std::string& listen,
                                                              PipelinePool& pool,
                                                              HttpApiOptions options) {
  if (options.tls && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
    return InvalidArgument("this libmicrohttpd has no TLS: the HTTP API cannot serve HTTPS");
  }
  std::unique_ptr<HttpApiServer> server(new HttpApiServer());
  server->internals_ = std::make_unique<Internals>(pool, std::move(options));
  Internals& in = *server->internals_;
  if (!in.options.token_file.empty()) {
    ASSIGN_OR_RETURN(in.tokens, TokenFile::Open(in.options.token_file));
  }
  ASSIGN_OR_RETURN(const int fd, OpenListenSocket(listen, {"http", "the HTTP API", 8080}, 256));
  const BoundAddress bound = BoundAddressOf(fd);
  server->address_ = bound.ToString();

  unsigned flags = MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME | (bound.ipv6 ? MHD_USE_IPv6 : 0);
  flags |= MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL_INTERNAL_THREAD
                                                                  : MHD_USE_POLL_INTERNAL_THREAD;
  const auto& tls = in.options.tls;
  if (tls) flags |= MHD_USE_TLS;
  const MHD_OPTION cert_option = tls ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END;
  // clang-format off: one option and its values a line
  server->daemon_ = MHD_start_daemon(
      flags, 0, nullptr, nullptr, &HandleRequest, &in, MHD_OPTION_EXTERNAL_LOGGER, &LogFromMhd,
      nullptr, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_THREAD_POOL_SIZE, kThreads,
      MHD_OPTION_CONNECTION_TIMEOUT, kIdleSeconds, MHD_OPTION_CONNECTION_LIMIT, kConnectionLimit,
      MHD_OPTION_NOTIFY_COMPLETED, &RequestCompleted, nullptr, cert_option,
      tls ? tls->first.c_str() : nullptr,  // MHD_OPTION_END without TLS
      MHD_OPTION_HTTPS_MEM_KEY, tls ? tls->second.c_str() : nullptr, MHD_OPTION_END);
  // clang-format on
  if (server->daemon_ == nullptr) {
    return Unavailable("cannot start the HTTP API on " + listen +
                       " (libmicrohttpd refused; see the log)");
  }
  in.watcher = std::thread(WatchHangUps, std::ref(in));
  return server;
}

HttpApiServer::~HttpApiServer() { Stop(); }

void HttpApiServer::Stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (daemon_ == nullptr) return;
  Internals& in = *internals_;
  {
    std::unique_lock<std::mutex> lock(in.mu);
    in.stopping = true;
    for (const auto& r : in.running) r->Cancel();
    in.idle.wait(lock, [&] { return in.running.empty(); });
  }
  in.stop_watch = true;
  in.watcher.join();
  MHD_stop_daemon(daemon_);
  daemon_ = nullptr;
}

}  // namespace qpool::api::http
