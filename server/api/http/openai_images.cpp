#include "api/http/openai_images.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "util/log.h"

namespace qpool::api::http {
namespace {

using nlohmann::json;

// The field's value as an unsigned integer no larger than `max`.
StatusOr<uint64_t> Unsigned(const json& v, const std::string& field, uint64_t max) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() > max) {
    return InvalidArgument(
        StrCat("field '", field, "' must be an integer from 0 to ", max, ", got ", v.dump()));
  }
  return v.get<uint64_t>();
}

StatusOr<uint32_t> Uint32(const json& v, const std::string& field) {
  ASSIGN_OR_RETURN(uint64_t u, Unsigned(v, field, std::numeric_limits<uint32_t>::max()));
  return static_cast<uint32_t>(u);
}

StatusOr<float> Float(const json& v, const std::string& field) {
  const double d = v.is_number() ? v.get<double>() : std::nan("");
  if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max()) {
    return InvalidArgument(StrCat("field '", field, "' must be a finite number, got ", v.dump()));
  }
  return static_cast<float>(d);
}

StatusOr<std::string> String(const json& v, const std::string& field) {
  if (!v.is_string()) {
    return InvalidArgument(StrCat("field '", field, "' must be a string, got ", v.dump()));
  }
  return v.get<std::string>();
}

// "WIDTHxHEIGHT", each 1-5 digits and not 0.
Status ParseSize(const std::string& size, GenerateRequestIn& in) {
  if (size == "auto") return Status::Ok();
  const size_t x = size.find('x');
  auto number = [](const std::string& s) -> std::optional<uint32_t> {
    if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos) {
      return std::nullopt;
    }
    const auto n = static_cast<uint32_t>(std::stoul(s));
    return n == 0 ? std::nullopt : std::optional<uint32_t>(n);
  };
  const auto w = x == std::string::npos ? std::nullopt : number(size.substr(0, x));
  const auto h = x == std::string::npos ? std::nullopt : number(size.substr(x + 1));
  if (!w || !h) {
    return InvalidArgument(StrCat("field 'size' must be \"WIDTHxHEIGHT\" (e.g. \"1024x1024\") or ",
                                  "\"auto\", got \"", size, "\""));
  }
  in.width = *w;
  in.height = *h;
  return Status::Ok();
}

const char* ErrorType(int http_code) {
  switch (http_code) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 409:
      return "conflict_error";
    case 429:
      return "rate_limit_error";
    default:
      return "server_error";
  }
}

// What GenerateResult carries besides the images.
json QpoolFields(const GenerateReply& reply) {
  const GenerateParams& p = reply.params;
  return {{"seed", p.seed},
          {"width", p.width},
          {"height", p.height},
          {"device", reply.run.device},
          {"scheduler", p.scheduler},
          {"steps", p.steps},
          {"guidance_scale", p.guidance_scale},
          {"route", reply.run.route},
          {"attempts", reply.run.attempts},
          {"batch_size", reply.batch_size},
          {"timings",
           {{"queue_seconds", reply.run.queue_seconds},
            {"encode_seconds", reply.timings.encode_seconds},
            {"denoise_seconds", reply.timings.denoise_seconds},
            {"decode_seconds", reply.timings.decode_seconds},
            {"png_seconds", reply.timings.png_seconds},
            {"total_seconds", reply.run.total_seconds}}}};
}

std::string Event(const char* name, const json& data) {
  return StrCat("event: ", name,
                "\ndata: ", data.dump(-1, ' ', false, json::error_handler_t::replace), "\n\n");
}

// {"error": {message, type, param, code}} for `status`.
json ErrorObject(const Status& status) {
  return {{"error",
           {{"message", status.message()},
            {"type", ErrorType(HttpCodeOf(status.code()))},
            {"param", nullptr},
            {"code", StatusCodeName(status.code())}}}};
}

}  // namespace

StatusOr<ImagesRequest> ParseImagesRequest(std::string_view body) {
  const json doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return InvalidArgument("the request body is not valid JSON");
  if (!doc.is_object()) return InvalidArgument("the request body must be a JSON object");
  ImagesRequest request;
  GenerateCall& call = request.call;
  GenerateRequestIn& in = call.request;
  bool has_model = false, has_prompt = false;
  // One entry per field: how its value goes into the request.
  for (const auto& [key, v] : doc.items()) {
    Status s = Status::Ok();
    auto set_uint = [&](std::optional<uint32_t>& out) {
      StatusOr<uint32_t> u = Uint32(v, key);
      if (u.ok()) out = *u;
      s = u.status();
    };
    if (key == "model") {
      StatusOr<std::string> m = String(v, key);
      if (m.ok()) in.pipeline = *m;
      s = m.status();
      has_model = true;
    } else if (key == "prompt") {
      StatusOr<std::string> p = String(v, key);
      if (p.ok()) in.prompt = *p;
      s = p.status();
      has_prompt = true;
    } else if (key == "n") {
      set_uint(in.num_images);
    } else if (key == "size") {
      StatusOr<std::string> size = String(v, key);
      s = size.ok() ? ParseSize(*size, in) : size.status();
    } else if (key == "response_format") {
      StatusOr<std::string> f = String(v, key);
      s = f.status();
      if (f.ok() && *f == "url") {
        s = InvalidArgument(
            "response_format 'url' is not served: an image URL would work only on the replica "
            "that made it; use 'b64_json'");
      } else if (f.ok() && *f != "b64_json") {
        s = InvalidArgument(StrCat("field 'response_format' must be 'b64_json', got '", *f, "'"));
      }
    } else if (key == "output_format") {
      StatusOr<std::string> f = String(v, key);
      s = f.status();
      if (f.ok() && *f != "png") {
        s = InvalidArgument(StrCat("field 'output_format' must be 'png', got '", *f, "'"));
      }
    } else if (key == "stream") {
      if (!v.is_boolean()) {
        s = InvalidArgument(StrCat("field 'stream' must be true or false, got ", v.dump()));
      } else {
        request.stream = v.get<bool>();
      }
    } else if (key == "user") {
      s = String(v, key).status();
    } else if (key == "negative_prompt") {
      StatusOr<std::string> p = String(v, key);
      if (p.ok()) in.negative_prompt = *p;
      s = p.status();
    } else if (key == "scheduler") {
      StatusOr<std::string> p = String(v, key);
      if (p.ok()) in.scheduler = *p;
      s = p.status();
    } else if (key == "steps") {
      set_uint(in.steps);
    } else if (key == "seed") {
      StatusOr<uint64_t> seed = Unsigned(v, key, std::numeric_limits<uint64_t>::max());
      if (seed.ok()) in.seed = *seed;
      s = seed.status();
    } else if (key == "guidance_scale" || key == "true_cfg_scale") {
      StatusOr<float> f = Float(v, key);
      if (f.ok()) (key == "guidance_scale" ? in.guidance_scale : in.true_cfg_scale) = *f;
      s = f.status();
    } else if (key == "original_width") {
      set_uint(in.original_width);
    } else if (key == "original_height") {
      set_uint(in.original_height);
    } else if (key == "target_width") {
      set_uint(in.target_width);
    } else if (key == "target_height") {
      set_uint(in.target_height);
    } else if (key == "crop_top") {
      set_uint(in.crop_top);
    } else if (key == "crop_left") {
      set_uint(in.crop_left);
    } else {
      s = InvalidArgument(StrCat("unknown field '", key,
                                 "' (docs/http-api.md lists the fields this endpoint takes)"));
    }
    RETURN_IF_ERROR(s);
  }
  if (!has_model) return InvalidArgument("field 'model' (the pipeline's name) is required");
  if (!has_prompt) return InvalidArgument("field 'prompt' is required");
  call.pipeline = in.pipeline;
  return request;
}

std::string ImagesResponseJson(GenerateReply reply, int64_t created) {
  json data = json::array();
  for (const GeneratedImage& image : reply.images)
    data.push_back({{"b64_json", Base64(image.png)}});
  return json{{"created", created}, {"data", std::move(data)}, {"qpool", QpoolFields(reply)}}
      .dump();
}

std::string ProgressEvent(int step, int total, double elapsed_seconds) {
  return Event("progress", {{"type", "progress"},
                            {"step", step},
                            {"total", total},
                            {"elapsed_seconds", elapsed_seconds}});
}

std::string CompletedEvents(GenerateReply reply, int64_t created) {
  const json qpool = QpoolFields(reply);
  std::string events;
  for (size_t i = 0; i < reply.images.size(); ++i) {
    const GeneratedImage& image = reply.images[i];
    events += Event("image_generation.completed", {{"type", "image_generation.completed"},
                                                   {"index", i},
                                                   {"b64_json", Base64(image.png)},
                                                   {"created_at", created},
                                                   {"size", StrCat(image.width, "x", image.height)},
                                                   {"output_format", "png"},
                                                   {"qpool", qpool}});
  }
  return events;
}

std::string ErrorEvent(const Status& status) {
  json event = ErrorObject(status);
  event["type"] = "error";
  return Event("error", event);
}

std::string ModelsJson(const std::vector<PipelineStatus>& pipelines, int64_t created) {
  json data = json::array();
  for (const PipelineStatus& p : pipelines) {
    data.push_back({{"id", p.name},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "qpool"},
                    {"kind", p.kind},
                    {"state", PipelineStateName(p.state)},
                    {"device", p.device},
                    {"in_flight", p.in_flight}});
  }
  return json{{"object", "list"}, {"data", std::move(data)}}.dump();
}

int HttpCodeOf(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition:
      return 409;
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kCancelled:
      return 499;
    case StatusCode::kInternal:
      return 500;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
  }
  return 500;
}

std::string ErrorJson(const Status& status) {
  return ErrorObject(status).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string Base64(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = uint32_t{static_cast<uint8_t>(bytes[i])} << 16 |
                       uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8 |
                       static_cast<uint8_t>(bytes[i + 2]);
    out += {kAlphabet[v >> 18], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63],
            kAlphabet[v & 63]};
  }
  if (const size_t left = bytes.size() - i; left > 0) {
    uint32_t v = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (left == 2) v |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += left == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace qpool::api::http
