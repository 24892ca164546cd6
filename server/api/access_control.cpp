#include "api/access_control.h"

#include <grpc/grpc_security_constants.h>

#include <cctype>

#include "util/log.h"
#include "util/tls_files.h"

namespace qpool::api {
namespace {

constexpr const char* kCodeNames[] = {"UNAUTHENTICATED", "PERMISSION_DENIED"};

// The token of `authorization: Bearer <token>` ("" if absent); `present` says whether the header
// was there at all, whatever its form.
std::string BearerToken(const grpc::CallbackServerContext& context, bool* present) {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  *present = it != metadata.end();
  if (!*present) return "";
  const std::string value(it->second.data(), it->second.size());
  static const std::string kScheme = "bearer ";
  if (value.size() <= kScheme.size()) return "";
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) return "";
  }
  return value.substr(kScheme.size());
}

// The identities a verified client certificate carries (Note [Admin credentials]): its DNS and
// URI subject alternative names, and its subject CN when it has exactly one; none for a CA
// certificate presented as a client's. `ca` says when that was why.
std::vector<std::string> ClientIdentities(const grpc::CallbackServerContext& context, bool* ca) {
  std::vector<std::string> out;
  *ca = false;
  const auto auth = context.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return out;
  const auto pem = auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pem.empty()) return out;
  const auto cert = ParseClientCertificate(std::string(pem.front().data(), pem.front().size()));
  if (!cert.ok()) return out;
  if (cert->is_ca) {
    *ca = true;
    return out;
  }
  if (cert->common_names.size() == 1) out.push_back(cert->common_names.front());
  for (const char* property : {GRPC_PEER_DNS_PROPERTY_NAME, GRPC_PEER_URI_PROPERTY_NAME}) {
    for (const auto& value : auth->FindPropertyValues(property)) {
      out.emplace_back(value.data(), value.size());
    }
  }
  return out;
}

// Admin calls are protected whatever --protect says (Note [Admin credentials]).
std::set<CallClass> WithAdmin(std::set<CallClass> protect) {
  protect.insert(CallClass::kAdmin);
  return protect;
}

}  // namespace

const char* CallClassName(CallClass c) {
  switch (c) {
    case CallClass::kAdmin:
      return "admin";
    case CallClass::kInference:
      return "inference";
    case CallClass::kRead:
      return "read";
  }
  return "unknown";
}

StatusOr<std::unique_ptr<AccessControl>> AccessControl::Create(const AccessOptions& options,
                                                               MetricsRegistry* metrics) {
  std::unique_ptr<TokenFile> tokens;
  if (!options.token_file.empty()) {
    ASSIGN_OR_RETURN(tokens, TokenFile::Open(options.token_file));
  }
  const bool credentials = tokens != nullptr || !options.allowed_clients.empty();
  if (!credentials && (options.protect.count(CallClass::kInference) != 0 ||
                       options.protect.count(CallClass::kRead) != 0)) {
    return InvalidArgument(
        "--protect names calls to protect but no credential is configured: set "
        "--admin-token-file or --admin-clients");
  }
  return std::unique_ptr<AccessControl>(new AccessControl(options, std::move(tokens), metrics));
}

AccessControl::AccessControl(const AccessOptions& options, std::unique_ptr<TokenFile> tokens,
                             MetricsRegistry* metrics)
    : protect_(WithAdmin(options.protect)),
      allowed_clients_(options.allowed_clients.begin(), options.allowed_clients.end()),
      tokens_(std::move(tokens)),
      enabled_(tokens_ != nullptr || !allowed_clients_.empty()) {
  if (metrics == nullptr) return;
  denied_ = &metrics->AddCounter("qpool_denied_calls_total",
                                 "Calls refused for missing or wrong credentials (Note [Admin "
                                 "credentials]), by the class of the call and the status code.",
                                 {"class", "code"});
  // Every series exists from the start, so an alert on its rate sees 0, not "no data".
  for (CallClass c : {CallClass::kAdmin, CallClass::kInference, CallClass::kRead}) {
    for (const char* code : kCodeNames) denied_->WithLabels({CallClassName(c), code});
  }
}

grpc::Status AccessControl::Check(const grpc::CallbackServerContext& context, CallClass call_class,
                                  const char* method) const {
  if (!enabled_ || protect_.count(call_class) == 0) return grpc::Status::OK;
  bool header = false;
  const std::string token = BearerToken(context, &header);
  if (header) {
    if (tokens_ != nullptr && !token.empty() && tokens_->Accepts(token)) return grpc::Status::OK;
    return Deny(call_class, grpc::StatusCode::UNAUTHENTICATED,
                StrCat(method, ": the authorization metadata is not a valid bearer token"),
                context);
  }
  bool ca = false;
  const std::vector<std::string> identities = ClientIdentities(context, &ca);
  for (const std::string& identity : identities) {
    if (allowed_clients_.count(identity) != 0) return grpc::Status::OK;
  }
  if (ca) {
    return Deny(call_class, grpc::StatusCode::PERMISSION_DENIED,
                StrCat(method, ": the client certificate is a CA certificate; only a client's own "
                               "(leaf) certificate names it"),
                context);
  }
  if (!identities.empty()) {
    return Deny(call_class, grpc::StatusCode::PERMISSION_DENIED,
                StrCat(method, ": client certificate '", identities.front(),
                       "' is not allowed to make ", CallClassName(call_class), " calls"),
                context);
  }
  const auto auth = context.auth_context();
  if (auth && auth->IsPeerAuthenticated()) {  // verified, but it names no client
    return Deny(call_class, grpc::StatusCode::PERMISSION_DENIED,
                StrCat(method, ": the client certificate names no client (one subject CN, or a "
                               "DNS or URI subject alternative name)"),
                context);
  }
  return Deny(call_class, grpc::StatusCode::UNAUTHENTICATED,
              StrCat(method,
                     " needs credentials: an 'authorization: Bearer <token>' metadata "
                     "entry",
                     allowed_clients_.empty() ? "" : " or an allowed client certificate"),
              context);
}

grpc::Status AccessControl::Deny(CallClass call_class, grpc::StatusCode code, std::string message,
                                 const grpc::CallbackServerContext& context) const {
  const char* code_name = code == grpc::StatusCode::UNAUTHENTICATED ? kCodeNames[0] : kCodeNames[1];
  if (denied_ != nullptr) denied_->WithLabels({CallClassName(call_class), code_name}).Inc();
  log::Debug("refused ", code_name, " from ", context.peer(), ": ", message);
  return grpc::Status(code, std::move(message));
}

}  // namespace qpool::api
