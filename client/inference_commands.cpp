// generate and encode: the InferenceService commands.
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "output.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::cli {
namespace {

using nlohmann::json;

std::optional<uint32_t> GetUint32(const ParsedArgs& args, const std::string& flag) {
  const std::optional<uint64_t> v = GetUint(args, flag);
  if (v && *v > std::numeric_limits<uint32_t>::max()) {
    throw UsageError{"option '--" + flag + "' is too large: " + std::to_string(*v)};
  }
  if (!v) return std::nullopt;
  return static_cast<uint32_t>(*v);
}

v1::GenerateRequest BuildGenerateRequest(const ParsedArgs& args) {
  v1::GenerateRequest request;
  request.set_pipeline(RequiredFlag(args, "pipeline"));
  request.set_prompt(RequiredFlag(args, "prompt"));
  if (auto v = GetString(args, "negative")) request.set_negative_prompt(*v);
  if (auto v = GetUint32(args, "steps")) request.set_steps(*v);
  if (auto v = GetDouble(args, "guidance")) request.set_guidance_scale(static_cast<float>(*v));
  if (auto v = GetUint32(args, "width")) request.set_width(*v);
  if (auto v = GetUint32(args, "height")) request.set_height(*v);
  if (auto v = GetUint32(args, "num-images")) request.set_num_images(*v);
  if (auto v = GetUint(args, "seed")) request.set_seed(*v);
  if (auto v = GetString(args, "scheduler")) request.set_scheduler(*v);
  if (auto v = GetUint32(args, "original-width")) request.set_original_width(*v);
  if (auto v = GetUint32(args, "original-height")) request.set_original_height(*v);
  if (auto v = GetUint32(args, "target-width")) request.set_target_width(*v);
  if (auto v = GetUint32(args, "target-height")) request.set_target_height(*v);
  if (auto v = GetUint32(args, "crop-top")) request.set_crop_top(*v);
  if (auto v = GetUint32(args, "crop-left")) request.set_crop_left(*v);
  if (auto v = GetDouble(args, "true-cfg")) request.set_true_cfg_scale(static_cast<float>(*v));
  return request;
}

json TimingsJson(const v1::Timings& t) {
  return {{"queue_seconds", t.queue_seconds()},     {"encode_seconds", t.encode_seconds()},
          {"denoise_seconds", t.denoise_seconds()}, {"decode_seconds", t.decode_seconds()},
          {"png_seconds", t.png_seconds()},         {"total_seconds", t.total_seconds()}};
}

const char* DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return "float32";
    case v1::DTYPE_FLOAT16:
      return "float16";
    case v1::DTYPE_BFLOAT16:
      return "bfloat16";
    case v1::DTYPE_INT64:
      return "int64";
    default:
      return "unspecified";
  }
}

size_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return 4;
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return 2;
    case v1::DTYPE_INT64:
      return 8;
    default:
      return 0;
  }
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1;
  const int exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa == 0 ? std::numeric_limits<float>::infinity()
                          : std::numeric_limits<float>::quiet_NaN();
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  }
  return sign ? -value : value;
}

// The tensor's values as doubles (little-endian host assumed, as the proto's byte order).
std::vector<double> TensorValues(const v1::Tensor& tensor) {
  const std::string& data = tensor.data();
  const size_t size = DTypeSize(tensor.dtype());
  std::vector<double> values;
  if (size == 0) return values;
  values.reserve(data.size() / size);
  for (size_t off = 0; off + size <= data.size(); off += size) {
    const char* p = data.data() + off;
    switch (tensor.dtype()) {
      case v1::DTYPE_FLOAT32: {
        float f;
        std::memcpy(&f, p, 4);
        values.push_back(f);
        break;
      }
      case v1::DTYPE_FLOAT16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        values.push_back(HalfToFloat(h));
        break;
      }
      case v1::DTYPE_BFLOAT16: {
        uint16_t b;
        std::memcpy(&b, p, 2);
        const uint32_t bits = static_cast<uint32_t>(b) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        values.push_back(f);
        break;
      }
      default: {
        int64_t i;
        std::memcpy(&i, p, 8);
        values.push_back(static_cast<double>(i));
      }
    }
  }
  return values;
}

std::string ShapeString(const v1::Tensor& tensor) {
  std::string s = "[";
  for (int i = 0; i < tensor.shape_size(); ++i)
    s += (i ? ", " : "") + std::to_string(tensor.shape(i));
  return s + "]";
}

}  // namespace

std::string RequiredFlag(const ParsedArgs& args, const std::string& flag) {
  std::optional<std::string> v = GetString(args, flag);
  if (!v || v->empty()) throw UsageError{"option '--" + flag + "' is required"};
  return *v;
}

int RunGenerate(const ParsedArgs& args, const Connection& connection) {
  const v1::GenerateRequest request = BuildGenerateRequest(args);
  const std::string out = GetString(args, "out").value_or("");
  auto stub = v1::InferenceService::NewStub(connection.channel());
  grpc::ClientContext context;
  connection.Prepare(&context);

  std::optional<v1::GenerateResult> result;
  uint32_t progress_events = 0;
  {
    ProgressBar bar;
    auto reader = stub->Generate(&context, request);
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      if (response.has_progress()) {
        ++progress_events;
        bar.Update(response.progress().step(), response.progress().total(),
                   response.progress().elapsed_seconds());
      } else if (response.has_result()) {
        result = std::move(*response.mutable_result());
      }
    }
    const grpc::Status status = reader->Finish();
    bar.Finish();
    if (!status.ok()) return connection.Fail(status);
  }
  if (!result) {
    return connection.Fail(
        grpc::Status(grpc::StatusCode::INTERNAL, "the stream ended without a result"));
  }

  if (!out.empty() && out.back() == '/')
    mkdir(out.c_str(), 0777);  // best effort; write reports errors
  json files = json::array();
  std::vector<std::string> paths;
  const size_t count = static_cast<size_t>(result->images_size());
  for (size_t i = 0; i < count; ++i) {
    const v1::Image& image = result->images(static_cast<int>(i));
    const std::string path = ImagePath(out, result->seed(), i, count);
    std::string error;
    if (!WriteFile(path, image.png(), &error)) {
      std::cerr << "error: " << error << "\n";
      return kExitRpcError;
    }
    paths.push_back(path);
    files.push_back({{"path", path},
                     {"width", image.width()},
                     {"height", image.height()},
                     {"seed", result->seed() + i},
                     {"bytes", image.png().size()}});
  }

  if (!args.global.json) {
    for (size_t i = 0; i < count; ++i) {
      const v1::Image& image = result->images(static_cast<int>(i));
      std::cout << paths[i] << "  " << image.width() << "x" << image.height() << "  seed "
                << result->seed() + i << "\n";
    }
    const v1::Timings& t = result->timings();
    std::cout << "seed " << result->seed() << "  steps " << result->steps() << "  scheduler "
              << result->scheduler() << "  guidance " << FormatFixed(result->guidance_scale(), 2)
              << "  device " << result->device() << " (" << result->route() << ")"
              << (result->batch_size() > 1 ? "  batch of " + std::to_string(result->batch_size())
                                           : std::string())
              << (result->attempts() > 1 ? "  attempts " + std::to_string(result->attempts())
                                         : std::string())
              << "\n"
              << "time " << FormatFixed(t.total_seconds(), 3) << " s (queue "
              << FormatFixed(t.queue_seconds(), 3) << ", encode "
              << FormatFixed(t.encode_seconds(), 3) << ", denoise "
              << FormatFixed(t.denoise_seconds(), 3) << ", decode "
              << FormatFixed(t.decode_seconds(), 3) << ", png " << FormatFixed(t.png_seconds(), 3)
              << ")\n";
    return kExitOk;
  }
  const json doc = {{"pipeline", request.pipeline()},
                    {"seed", result->seed()},
                    {"steps", result->steps()},
                    {"scheduler", result->scheduler()},
                    {"guidance_scale", result->guidance_scale()},
                    {"device", result->device()},
                    {"route", result->route()},
                    {"attempts", result->attempts()},
                    {"batch_size", result->batch_size()},
                    {"progress_events", progress_events},
                    {"timings", TimingsJson(result->timings())},
                    {"images", files}};
  std::cout << doc.dump(2) << "\n";
  return kExitOk;
}

int RunEncode(const ParsedArgs& args, const Connection& connection) {
  v1::EncodeRequest request;
  request.set_pipeline(RequiredFlag(args, "pipeline"));
  for (const std::string& prompt : args.positional) request.add_prompts(prompt);
  const std::optional<std::string> out = GetString(args, "out");
  if (const std::optional<std::string> dtype = GetString(args, "dtype")) {
    if (*dtype == "bfloat16") {
      request.set_dtype(v1::DTYPE_BFLOAT16);
    } else if (*dtype == "float16") {
      request.set_dtype(v1::DTYPE_FLOAT16);
    } else if (*dtype != "float32") {
      throw UsageError{"option '--dtype' wants float32, bfloat16 or float16, not '" + *dtype + "'"};
    }
  }

  auto stub = v1::InferenceService::NewStub(connection.channel());
  grpc::ClientContext context;
  connection.Prepare(&context);
  v1::EncodeResponse response;
  const grpc::Status status = stub->Encode(&context, request, &response);
  if (!status.ok()) return connection.Fail(status);

  const v1::Tensor& emb = response.embeddings();
  const v1::Tensor& ids = response.input_ids();
  if (out) {
    std::string error;
    if (!WriteFile(*out, emb.data(), &error)) {
      std::cerr << "error: " << error << "\n";
      return kExitRpcError;
    }
  }
  const std::vector<double> values = TensorValues(emb);
  double mean = 0;
  double var = 0;
  for (double v : values) mean += v;
  if (!values.empty()) mean /= static_cast<double>(values.size());
  for (double v : values) var += (v - mean) * (v - mean);
  const double std_dev =
      values.size() > 1 ? std::sqrt(var / static_cast<double>(values.size() - 1)) : 0;
  const std::vector<double> first(values.begin(),
                                  values.begin() + std::min<size_t>(8, values.size()));

  // input_ids rows, each cut after the last non-zero token for readability.
  const std::vector<double> id_values = TensorValues(ids);
  const size_t rows = ids.shape_size() > 0 ? static_cast<size_t>(ids.shape(0)) : 0;
  const size_t row_len = rows > 0 ? id_values.size() / rows : 0;
  std::vector<std::vector<int64_t>> id_rows(rows);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < row_len; ++c)
      id_rows[r].push_back(static_cast<int64_t>(id_values[r * row_len + c]));
  }

  if (args.global.json) {
    json doc = {{"pipeline", request.pipeline()},
                {"device", response.device()},
                {"embeddings",
                 {{"dtype", DTypeName(emb.dtype())},
                  {"shape", json(std::vector<int64_t>(emb.shape().begin(), emb.shape().end()))},
                  {"bytes", emb.data().size()},
                  {"mean", mean},
                  {"std", std_dev},
                  {"first", first}}},
                {"input_ids",
                 {{"dtype", DTypeName(ids.dtype())},
                  {"shape", json(std::vector<int64_t>(ids.shape().begin(), ids.shape().end()))},
                  {"values", id_rows}}}};
    if (response.has_pooled_embeddings()) {
      const v1::Tensor& pooled = response.pooled_embeddings();
      doc["pooled_embeddings"] = {
          {"dtype", DTypeName(pooled.dtype())},
          {"shape", json(std::vector<int64_t>(pooled.shape().begin(), pooled.shape().end()))}};
    }
    if (out) doc["out"] = *out;
    std::cout << doc.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "embeddings  " << DTypeName(emb.dtype()) << " " << ShapeString(emb) << "  device "
            << response.device() << "\n"
            << "  mean " << FormatFixed(mean, 6) << "  std " << FormatFixed(std_dev, 6)
            << "\n  first";
  for (double v : first) std::cout << " " << FormatFixed(v, 4);
  std::cout << "\n";
  if (response.has_pooled_embeddings()) {
    const v1::Tensor& pooled = response.pooled_embeddings();
    std::cout << "pooled      " << DTypeName(pooled.dtype()) << " " << ShapeString(pooled) << "\n";
  }
  std::cout << "input_ids   " << DTypeName(ids.dtype()) << " " << ShapeString(ids) << "\n";
  for (size_t r = 0; r < rows; ++r) {
    size_t end = id_rows[r].size();
    while (end > 1 && id_rows[r][end - 1] == id_rows[r][end - 2]) --end;  // drop padding repeats
    std::cout << "  [" << r << "]";
    for (size_t c = 0; c < end; ++c) std::cout << " " << id_rows[r][c];
    if (end < id_rows[r].size()) std::cout << " ...";
    std::cout << "\n";
  }
  if (out) std::cout << "wrote " << emb.data().size() << " bytes to " << *out << "\n";
  return kExitOk;
}

}  // namespace qpool::cli
