#include "quant/module_quantizer.h"

#include <c10/core/GradMode.h>

#include <array>
#include <utility>

#include "component/component.h"
#include "quant/quant_format.h"
#include "quant/quantizer.h"

namespace qpool::quant {

namespace {

struct Layer {
  std::string name;
  torch::jit::Module module;
};

std::string DisplayName(const std::string& name) { return name.empty() ? "<root>" : name; }

QuantState ReadState(const torch::jit::Module& m) {
  return QuantState{m.attr("weight").toTensor(),      m.attr("absmax").toTensor(),
                    m.attr("code").toTensor(),        m.attr("nested_absmax").toTensor(),
                    m.attr("nested_code").toTensor(), m.attr("offset").toTensor()};
}

// Describes an already-quantized state, e.g. "nf4 (blocksize 64, double quant)" (a w8a8 layer
// with calibrated activation scales is "w8a8" like one with ones).
std::string Describe(const QuantState& s) {
  if (s.weight.scalar_type() == at::kChar) return s.code.numel() > 0 ? "w8a8" : "int8";
  if (s.weight.scalar_type() != at::kByte) return "none";
  const int64_t blocksize = s.absmax.numel() > 0 ? 2 * s.weight.numel() / s.absmax.numel() : 0;
  std::string d = "nf4 (blocksize " + std::to_string(blocksize);
  return d + (s.absmax.scalar_type() == at::kByte ? ", double quant)" : ")");
}

std::string Describe(const QuantOptions& o) {
  if (o.format != QuantFormat::kNf4) return QuantFormatName(o.format);
  return "nf4 (blocksize " + std::to_string(o.blocksize) +
         (o.double_quant ? ", double quant)" : ")");
}

bool Skipped(const std::string& name, const std::vector<std::string>& skip) {
  for (const std::string& s : skip) {
    if (!s.empty() && name.find(s) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

bool IsQuantLinear(const torch::jit::Module& module) {
  if (!module.hasattr("weight")) return false;
  for (const char* n : kQuantStateNames) {
    if (!module.hasattr(n)) return false;
  }
  return true;
}

StatusOr<QuantizeReport> QuantizeModule(torch::jit::Module& module, const QuantSettings& settings,
                                        const std::optional<c10::Device>& compute) {
  ASSIGN_OR_RETURN(QuantFormat format, ParseQuantFormat(settings.format));
  QuantOptions options;
  options.format = format;
  options.blocksize = settings.blocksize;
  options.double_quant = settings.double_quant;
  if (format == QuantFormat::kNf4) RETURN_IF_ERROR(ValidateBlocksize(settings.blocksize));
  QuantizeReport report;
  if (format == QuantFormat::kNone) return report;
  const std::string wanted = Describe(options);

  try {
    c10::AutoGradMode no_grad(false);
    // Pass 1: find and check every layer; modify nothing.
    std::vector<Layer> todo;
    for (const auto& item : module.named_modules()) {
      if (!IsQuantLinear(item.value)) continue;
      if (Skipped(item.name, settings.skip)) {
        ++report.layers_skipped;
        continue;
      }
      const QuantState s = ReadState(item.value);
      if (at::isFloatingType(s.weight.scalar_type()) && s.weight.numel() < settings.min_weights) {
        ++report.layers_small;  // Note [Small layers stay float]
        continue;
      }
      const int64_t bytes = StateBytes(s);
      report.bytes_before += bytes;
      if (s.weight.dim() != 2 || s.weight.numel() == 0) {
        return InvalidArgument("layer '" + DisplayName(item.name) +
                               "': weight must be a non-empty 2-D [out, in] tensor, got " +
                               std::to_string(s.weight.dim()) + "-D with " +
                               std::to_string(s.weight.numel()) + " elements");
      }
      if (at::isFloatingType(s.weight.scalar_type())) {
        todo.push_back({item.name, item.value});
        continue;
      }
      const std::string have = Describe(s);
      if (have != wanted) {
        return InvalidArgument("layer '" + DisplayName(item.name) + "' is already quantized as " +
                               have + " but " + wanted +
                               " was requested; export it unquantized to quantize at load time");
      }
      ++report.layers_already_quantized;
      report.bytes_after += bytes;
    }
    if (todo.empty() && report.layers_already_quantized == 0 && report.layers_small == 0) {
      return InvalidArgument(
          "no quantizable layers: the component has no qpool QuantLinear layers" +
          std::string(report.layers_skipped > 0
                          ? " left after skip (" + std::to_string(report.layers_skipped) +
                                " skipped)"
                          : "") +
          "; write it with `qpool_export --quant-mode load-time` or `qpool_export "
          "from-diffusers --quant-mode load-time` (quantizable float layers)");
    }
    // Pass 2: quantize layer by layer, dropping each float weight as soon as it is replaced.
    for (Layer& layer : todo) {
      const torch::Tensor weight = layer.module.attr("weight").toTensor();
      const c10::Device home = weight.device();
      // Note [Load-time quantization]: double quantization stays where the weights are.
      const bool elsewhere = compute && *compute != home && !options.double_quant;
      StatusOr<QuantState> q =
          Quantize(elsewhere ? weight.to(*compute) : weight, options, DisplayName(layer.name));
      if (!q.ok()) return q.status();
      if (elsewhere) {
        for (torch::Tensor* t :
             {&q->weight, &q->absmax, &q->code, &q->nested_absmax, &q->nested_code, &q->offset}) {
          *t = t->to(home);
        }
      }
      layer.module.setattr("weight", q->weight);
      layer.module.setattr("absmax", q->absmax);
      layer.module.setattr("code", q->code);
      layer.module.setattr("nested_absmax", q->nested_absmax);
      layer.module.setattr("nested_code", q->nested_code);
      layer.module.setattr("offset", q->offset);
      report.bytes_after += StateBytes(*q);
      ++report.layers_quantized;
      report.quantized.push_back(DisplayName(layer.name));
    }
  } catch (const c10::Error& e) {
    return Internal("quantizing the component failed: " + std::string(e.what_without_backtrace()));
  }
  return report;
}

}  // namespace qpool::quant
