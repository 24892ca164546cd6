#include "quant/quant_format.h"

#include <c10/util/Exception.h>

namespace qpool::quant {

StatusOr<QuantFormat> ParseQuantFormat(const std::string& name) {
  if (name == "none") return QuantFormat::kNone;
  if (name == "int8") return QuantFormat::kInt8;
  if (name == "nf4") return QuantFormat::kNf4;
  if (name == "w8a8") return QuantFormat::kW8A8;
  return InvalidArgument("unknown quantization format '" + name +
                         "' (expected none, int8, nf4 or w8a8)");
}

const char* QuantFormatName(QuantFormat format) {
  switch (format) {
    case QuantFormat::kNone:
      return "none";
    case QuantFormat::kInt8:
      return "int8";
    case QuantFormat::kNf4:
      return "nf4";
    case QuantFormat::kW8A8:
      return "w8a8";
  }
  return "unknown";
}

Status ValidateBlocksize(int64_t blocksize) {
  const bool power_of_two = blocksize > 0 && (blocksize & (blocksize - 1)) == 0;
  if (!power_of_two || blocksize < kMinBlocksize || blocksize > kMaxBlocksize) {
    return InvalidArgument("nf4 blocksize must be a power of two in [" +
                           std::to_string(kMinBlocksize) + ", " + std::to_string(kMaxBlocksize) +
                           "], got " + std::to_string(blocksize));
  }
  return Status::Ok();
}

at::Tensor Nf4Code(const at::Device& device) {
  at::Tensor code = at::empty({16}, at::kFloat);
  float* p = code.data_ptr<float>();
  for (size_t i = 0; i < kNf4Code.size(); ++i) p[i] = kNf4Code[i];
  return code.to(device);
}

at::Tensor NestedCode(const at::Device& device) {
  // Same operations as quant.py's nested_code(): arange(256).sub(128).div(127) in float32.
  return at::arange(256, at::TensorOptions().dtype(at::kFloat).device(device)).sub(128).div(127);
}

at::Tensor EmptyState(const at::Device& device) {
  return at::empty({0}, at::TensorOptions().dtype(at::kFloat).device(device));
}

namespace {

void CheckEmpty(const at::Tensor& t, const char* name, const char* format, const char* what) {
  TORCH_CHECK(!t.defined() || t.numel() == 0, what, ": ", name, " must be empty for format ",
              format, " but has ", t.numel(), " elements");
}

void CheckFloat32(const at::Tensor& t, const char* name, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, what, ": ", name, " must be float32, got ",
              t.scalar_type());
}

}  // namespace

QuantLayout InspectQuantState(const QuantState& s, int64_t in_features, const char* what) {
  QuantLayout layout;
  layout.in_features = in_features;
  TORCH_CHECK(s.weight.defined(), what, ": weight is undefined");
  TORCH_CHECK(s.weight.dim() == 2, what, ": weight must be 2-D [out, in], got ", s.weight.sizes());
  for (const at::Tensor* t : {&s.absmax, &s.code, &s.nested_absmax, &s.nested_code, &s.offset}) {
    TORCH_CHECK(t->defined(), what, ": a quant state tensor is undefined (use an empty tensor)");
  }
  layout.out_features = s.weight.size(0);
  const at::ScalarType wt = s.weight.scalar_type();

  if (at::isFloatingType(wt)) {
    layout.format = QuantFormat::kNone;
    TORCH_CHECK(s.weight.size(1) == in_features, what, ": weight is ", s.weight.sizes(),
                " but the input has ", in_features, " features");
    CheckEmpty(s.absmax, "absmax", "none", what);
    CheckEmpty(s.code, "code", "none", what);
    CheckEmpty(s.nested_absmax, "nested_absmax", "none", what);
    CheckEmpty(s.nested_code, "nested_code", "none", what);
    CheckEmpty(s.offset, "offset", "none", what);
    layout.padded_in = in_features;
    layout.row_bytes = in_features * s.weight.element_size();
    return layout;
  }

  if (wt == at::kChar) {
    // int8 (weight-only) or, with activation scales in code, w8a8.
    const bool w8a8 = s.code.numel() > 0;
    layout.format = w8a8 ? QuantFormat::kW8A8 : QuantFormat::kInt8;
    const char* name = QuantFormatName(layout.format);
    TORCH_CHECK(s.weight.size(1) == in_features, what, ": ", name, " weight is ", s.weight.sizes(),
                " but the input has ", in_features, " features");
    CheckFloat32(s.absmax, "absmax", what);
    TORCH_CHECK(s.absmax.numel() == layout.out_features, what, ": ", name, " absmax must have ",
                layout.out_features, " elements (one per output row), got ", s.absmax.numel());
    if (w8a8) {
      TORCH_CHECK(
          s.code.scalar_type() == at::kFloat && s.code.dim() == 1 && s.code.numel() == in_features,
          what, ": w8a8 code (activation scales) must be float32 [", in_features, "], got ",
          s.code.scalar_type(), " ", s.code.sizes());
    }
    CheckEmpty(s.nested_absmax, "nested_absmax", name, what);
    CheckEmpty(s.nested_code, "nested_code", name, what);
    CheckEmpty(s.offset, "offset", name, what);
    layout.padded_in = in_features;
    layout.row_bytes = in_features;
    return layout;
  }

  TORCH_CHECK(wt == at::kByte, what, ": weight dtype ", wt,
              " is not a known format (floating: none, int8: int8 or w8a8, uint8: nf4)");
  layout.format = QuantFormat::kNf4;
  layout.row_bytes = s.weight.size(1);
  layout.padded_in = 2 * layout.row_bytes;
  layout.nblocks = s.absmax.numel();
  TORCH_CHECK(layout.nblocks > 0, what, ": nf4 absmax is empty");
  const int64_t unpacked = layout.out_features * layout.padded_in;
  TORCH_CHECK(unpacked % layout.nblocks == 0, what, ": nf4 weight ", s.weight.sizes(), " holds ",
              unpacked, " values, not a multiple of absmax's ", layout.nblocks);
  layout.blocksize = unpacked / layout.nblocks;
  Status bs = ValidateBlocksize(layout.blocksize);
  TORCH_CHECK(bs.ok(), what, ": derived ", bs.message());
  TORCH_CHECK(layout.padded_in % layout.blocksize == 0, what, ": nf4 rows of ", layout.padded_in,
              " values are not a whole number of blocks of ", layout.blocksize);
  TORCH_CHECK(in_features <= layout.padded_in && in_features > layout.padded_in - layout.blocksize,
              what, ": nf4 weight rows hold ", layout.padded_in, " values (blocksize ",
              layout.blocksize, ") but the input has ", in_features, " features");
  TORCH_CHECK(s.code.scalar_type() == at::kFloat && s.code.numel() == 16, what,
              ": nf4 code must be float32 [16], got ", s.code.scalar_type(), " ", s.code.sizes());

  if (s.absmax.scalar_type() == at::kFloat) {
    CheckEmpty(s.nested_absmax, "nested_absmax", "nf4 without double quant", what);
    CheckEmpty(s.nested_code, "nested_code", "nf4 without double quant", what);
    CheckEmpty(s.offset, "offset", "nf4 without double quant", what);
    return layout;
  }
  TORCH_CHECK(s.absmax.scalar_type() == at::kByte, what,
              ": nf4 absmax must be float32 (or uint8 with double quant), got ",
              s.absmax.scalar_type());
  layout.double_quant = true;
  const int64_t nested = (layout.nblocks + kNestedBlocksize - 1) / kNestedBlocksize;
  CheckFloat32(s.nested_absmax, "nested_absmax", what);
  TORCH_CHECK(s.nested_absmax.numel() == nested, what, ": nested_absmax must have ", nested,
              " elements (ceil(", layout.nblocks, " / 256)), got ", s.nested_absmax.numel());
  TORCH_CHECK(s.nested_code.scalar_type() == at::kFloat && s.nested_code.numel() == 256, what,
              ": nested_code must be float32 [256], got ", s.nested_code.scalar_type(), " ",
              s.nested_code.sizes());
  TORCH_CHECK(s.offset.scalar_type() == at::kFloat && s.offset.numel() == 1, what,
              ": offset must be one float32, got ", s.offset.scalar_type(), " ", s.offset.sizes());
  return layout;
}

}  // namespace qpool::quant
