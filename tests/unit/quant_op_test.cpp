// qpool::quant_linear through the dispatcher on CPU, its schema (against quant.py), its errors,
// and load-time quantization of a TorchScript module.
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "component/component.h"
#include "quant/module_quantizer.h"
#include "quant/quant_format.h"
#include "quant/quant_linear_op.h"
#include "quant/quantizer.h"
#include "quant/w8a8_linear.h"
#include "testing/c10_error.h"
#include "testing/test_paths.h"

namespace qpool::quant {
namespace {

using testing::ErrorOf;

QuantState StateFor(const at::Tensor& w, QuantFormat f, int64_t bs = 64, bool dq = false) {
  StatusOr<QuantState> s = Quantize(w, QuantOptions{f, bs, dq});
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *s;
}

TEST(QuantLinearOp, SchemaMatchesPythonReference) {
  const auto& op = c10::Dispatcher::singleton().findSchemaOrThrow("qpool::quant_linear", "");
  std::ostringstream printed;
  printed << op.schema();
  EXPECT_EQ(printed.str(), std::string("qpool::") + kQuantLinearSchema);

  const std::string path = testing::SourceDir() + "/tools/qpool_export/qpool_export/quant.py";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  std::string line, python;
  while (std::getline(in, line)) {
    if (line.rfind("SCHEMA = \"", 0) == 0) {
      const size_t end = line.find('"', 10);
      python = line.substr(10, end - 10);
    }
  }
  EXPECT_EQ(python, kQuantLinearSchema) << "SCHEMA in " << path;
}

TEST(QuantLinearOp, CpuEqualsDequantizeThenLinear) {
  torch::manual_seed(11);
  struct Case {
    QuantFormat f;
    int64_t bs;
    bool dq;
  };
  for (Case c : {Case{QuantFormat::kNone, 64, false}, Case{QuantFormat::kInt8, 64, false},
                 Case{QuantFormat::kNf4, 64, false}, Case{QuantFormat::kNf4, 16, true}}) {
    for (int64_t k : {64, 70}) {
      at::Tensor w = at::randn({24, k});
      at::Tensor bias = at::randn({24});
      QuantState s = StateFor(w, c.f, c.bs, c.dq);
      at::Tensor x = at::randn({2, 5, k});
      at::Tensor expected = at::linear(x, Dequantize(s, k), bias);
      at::Tensor y = QuantLinear(x, s, bias);
      EXPECT_EQ(y.sizes(), at::IntArrayRef({2, 5, 24}));
      EXPECT_TRUE(at::allclose(y, expected, 1e-5, 1e-5)) << QuantFormatName(c.f) << " K=" << k;
      // Without bias, and in bfloat16 (computed in float32, output in x's dtype).
      EXPECT_TRUE(at::allclose(QuantLinear(x, s), at::linear(x, Dequantize(s, k)), 1e-5, 1e-5));
      at::Tensor yb = QuantLinear(x.to(at::kBFloat16), s, bias);
      EXPECT_EQ(yb.scalar_type(), at::kBFloat16);
      at::Tensor eb = at::linear(x.to(at::kBFloat16).to(at::kFloat), Dequantize(s, k), bias);
      EXPECT_TRUE(at::allclose(yb.to(at::kFloat), eb, 1e-2, 1e-2));
    }
  }
}

TEST(QuantLinearOp, QuantizedOutputIsCloseToTheFloatLayer) {
  torch::manual_seed(12);
  at::Tensor w = at::randn({64, 256}) * 0.05;
  at::Tensor x = at::randn({8, 256});
  at::Tensor ref = at::linear(x, w);
  const double scale = ref.abs().mean().item<double>();
  const double int8_err =
      (QuantLinear(x, StateFor(w, QuantFormat::kInt8)) - ref).abs().mean().item<double>();
  const double nf4_err =
      (QuantLinear(x, StateFor(w, QuantFormat::kNf4)) - ref).abs().mean().item<double>();
  EXPECT_LT(int8_err, 0.01 * scale);
  EXPECT_LT(nf4_err, 0.15 * scale);
  EXPECT_LT(int8_err, nf4_err);
}

TEST(QuantLinearOp, ShapeAndDtypeErrorsAreClear) {
  QuantState s = StateFor(at::randn({8, 32}), QuantFormat::kNf4, 16);
  EXPECT_NE(ErrorOf([&] {
              QuantLinear(at::ones({2, 32}, at::kInt), s);
            }).find("x must be float32, float16 or bfloat16"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              QuantLinear(at::randn({2, 64}), s);
            }).find("the input has 64 features"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              QuantLinear(at::randn({2, 32}), s, at::randn({7}));
            }).find("bias must be [8]"),
            std::string::npos);
  QuantState no_code = s;
  no_code.code = EmptyState();
  EXPECT_NE(ErrorOf([&] {
              QuantLinear(at::randn({2, 32}), no_code);
            }).find("code"),
            std::string::npos);
  QuantState i8 = StateFor(at::randn({8, 32}), QuantFormat::kInt8);
  i8.absmax = i8.absmax.slice(0, 0, 4);
  EXPECT_NE(ErrorOf([&] {
              QuantLinear(at::randn({2, 32}), i8);
            }).find("int8 absmax must have 8"),
            std::string::npos);
}

TEST(QuantLinearOp, DeviceMismatchNamesTheTensor) {
  QuantState s = StateFor(at::randn({8, 32}), QuantFormat::kNf4, 16);
  s.code = s.code.to(at::kMeta);
  const std::string err = ErrorOf([&] { QuantLinear(at::randn({2, 32}), s); });
  EXPECT_NE(err.find("code is on meta but x is on cpu"), std::string::npos) << err;
  // Called directly, the CPU kernel checks too (a CUDA tensor would reach it the same way).
  const std::string direct = ErrorOf([&] {
    QuantLinearCpu(at::randn({2, 32}), s.weight, s.absmax, s.code, s.nested_absmax, s.nested_code,
                   s.offset, std::nullopt);
  });
  EXPECT_NE(direct.find("code is on meta"), std::string::npos) << direct;
}

TEST(QuantLinearOp, MetaGivesTheOutputShape) {
  QuantState s = StateFor(at::randn({8, 32}), QuantFormat::kInt8);
  QuantState meta{s.weight.to(at::kMeta),      s.absmax.to(at::kMeta),
                  s.code.to(at::kMeta),        s.nested_absmax.to(at::kMeta),
                  s.nested_code.to(at::kMeta), s.offset.to(at::kMeta)};
  at::Tensor y = QuantLinear(at::empty({3, 4, 32}, at::TensorOptions().device(at::kMeta)), meta);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.sizes(), at::IntArrayRef({3, 4, 8}));
}

// Resolves `qpool.quant_linear` (C++ define() only knows `torch.*` builtins).
struct QpoolResolver : torch::jit::NativeResolver {
  std::shared_ptr<torch::jit::SugaredValue> resolveValue(
      const std::string& name, torch::jit::GraphFunction& m,
      const torch::jit::SourceRange& loc) override {
    if (name == "qpool") return std::make_shared<torch::jit::BuiltinModule>("qpool");
    return torch::jit::NativeResolver::resolveValue(name, m, loc);
  }
};

// A quantizable linear layer in the layout of quant.py's QuantLinear, built in C++.
torch::jit::Module MakeLinear(const std::string& cls, const at::Tensor& w,
                              const std::optional<at::Tensor>& bias) {
  torch::jit::Module m("__torch__.qpool_test." + cls);
  m.register_buffer("weight", w);
  for (const char* n : {"absmax", "code", "nested_absmax", "nested_code", "offset"}) {
    m.register_buffer(n, EmptyState());
  }
  if (bias) m.register_buffer("bias", *bias);
  m.define(std::string(R"JIT(
def forward(self, x):
    return qpool.quant_linear(x, self.weight, self.absmax, self.code,
        self.nested_absmax, self.nested_code, self.offset, )JIT") +
               (bias ? "self.bias" : "None") + ")\n",
           std::make_shared<QpoolResolver>());
  return m;
}

torch::jit::Module MakeNet(const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2) {
  torch::jit::Module net("__torch__.qpool_test.Net");
  net.register_module("proj_in", MakeLinear("ProjIn", w1, b1));
  net.register_module("proj_out", MakeLinear("ProjOut", w2, std::nullopt));
  net.define(R"JIT(
def forward(self, x):
    return self.proj_out.forward(torch.relu(self.proj_in.forward(x)))
)JIT");
  return net;
}

at::Tensor Forward(torch::jit::Module& m, const at::Tensor& x) { return m.forward({x}).toTensor(); }

TEST(ModuleQuantizer, QuantizesAtLoadTimeAndMatchesTheReference) {
  torch::manual_seed(13);
  at::Tensor w1 = at::randn({48, 40}), b1 = at::randn({48}), w2 = at::randn({16, 48});
  at::Tensor x = at::randn({20, 40});  // 20 rows: w8a8 multiplies in int8 (Note [W8A8 linear])
  struct Case {
    const char* format;
    int bs;
    bool dq;
  };
  for (Case c : {Case{"int8", 64, false}, Case{"nf4", 64, false}, Case{"nf4", 16, true},
                 Case{"w8a8", 64, false}}) {
    torch::jit::Module net = MakeNet(w1.clone(), b1, w2.clone());
    // Keep only a weak reference to the float weight: quantization must release it.
    c10::weak_intrusive_ptr<c10::StorageImpl> float_storage(
        net.attr("proj_in").toModule().attr("weight").toTensor().storage().getWeakStorageImpl());
    QuantSettings settings;
    settings.format = c.format;
    settings.blocksize = c.bs;
    settings.double_quant = c.dq;
    StatusOr<QuantizeReport> report = QuantizeModule(net, settings);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->layers_quantized, 2);
    EXPECT_EQ(report->quantized, (std::vector<std::string>{"proj_in", "proj_out"}));
    EXPECT_EQ(report->bytes_before, (48 * 40 + 16 * 48) * 4);
    if (std::string(c.format) == "int8") {
      EXPECT_EQ(report->bytes_after, 48 * 40 + 48 * 4 + 16 * 48 + 16 * 4);  // q + row absmax
    } else if (std::string(c.format) == "w8a8") {                           // + activation scales
      EXPECT_EQ(report->bytes_after, 48 * 40 + 48 * 4 + 40 * 4 + 16 * 48 + 16 * 4 + 48 * 4);
    } else {
      EXPECT_LT(report->bytes_after, report->bytes_before);
    }
    EXPECT_TRUE(float_storage.expired()) << "the float weight is still referenced";

    QuantOptions o{*ParseQuantFormat(c.format), c.bs, c.dq};
    QuantState s1 = *Quantize(w1, o), s2 = *Quantize(w2, o);
    at::Tensor expected;
    if (o.format == QuantFormat::kW8A8) {  // x is quantized too: the op, checked elsewhere
      expected = QuantLinear(at::relu(QuantLinear(x, s1, b1)), s2);
    } else {
      at::Tensor h = at::relu(at::linear(x, Dequantize(s1, 40), b1));
      expected = at::linear(h, Dequantize(s2, 48));
    }
    EXPECT_TRUE(at::allclose(Forward(net, x), expected, 1e-5, 1e-5)) << c.format;
    torch::jit::Module in = net.attr("proj_in").toModule();
    EXPECT_TRUE(at::equal(in.attr("weight").toTensor(), s1.weight));
    EXPECT_TRUE(at::equal(in.attr("absmax").toTensor(), s1.absmax));
    EXPECT_TRUE(at::equal(in.attr("code").toTensor(), s1.code));

    // Quantizing again with the same settings keeps the layers; other settings are refused.
    StatusOr<QuantizeReport> again = QuantizeModule(net, settings);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->layers_already_quantized, 2);
    EXPECT_EQ(again->layers_quantized, 0);
    QuantSettings other = settings;
    other.format = std::string(c.format) == "int8" ? "w8a8" : "int8";
    StatusOr<QuantizeReport> conflict = QuantizeModule(net, other);
    ASSERT_FALSE(conflict.ok());
    EXPECT_EQ(conflict.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(conflict.status().message().find("already quantized"), std::string::npos);
  }
}

// Note [Load-time quantization]: quantized on the GPU (as loads onto a GPU do), a layer gets the
// bytes the CPU (and a pre-quantized export) gives it, and its tensors stay where the weight was
// (double quantization is done on the CPU: its mean is not bit-exact across devices).
TEST(ModuleQuantizer, QuantizingOnTheGpuGivesTheCpuBytes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available";
  torch::manual_seed(15);
  at::Tensor w1 = at::randn({320, 520}) * 3, b1 = at::randn({320}), w2 = at::randn({72, 320});
  for (const char* format : {"int8", "nf4", "w8a8"}) {
    for (bool dq : {false, true}) {
      if (dq && std::string(format) != "nf4") continue;
      QuantSettings settings;
      settings.format = format;
      settings.double_quant = dq;
      torch::jit::Module on_cpu = MakeNet(w1.clone(), b1, w2.clone());
      torch::jit::Module on_gpu = MakeNet(w1.clone(), b1, w2.clone());
      ASSERT_TRUE(QuantizeModule(on_cpu, settings).ok());
      ASSERT_TRUE(QuantizeModule(on_gpu, settings, c10::Device(c10::kCUDA, 0)).ok());
      for (const char* layer : {"proj_in", "proj_out"}) {
        for (const char* name :
             {"weight", "absmax", "code", "nested_absmax", "nested_code", "offset"}) {
          const at::Tensor want = on_cpu.attr(layer).toModule().attr(name).toTensor();
          const at::Tensor got = on_gpu.attr(layer).toModule().attr(name).toTensor();
          EXPECT_TRUE(got.device().is_cpu()) << layer << "." << name;
          EXPECT_TRUE(at::equal(got, want))
              << format << (dq ? " dq " : " ") << layer << "." << name;
        }
      }
    }
  }
}

TEST(ModuleQuantizer, SkipKeepsLayersInFullPrecision) {
  torch::manual_seed(14);
  at::Tensor w1 = at::randn({48, 40}), b1 = at::randn({48}), w2 = at::randn({16, 48});
  torch::jit::Module net = MakeNet(w1, b1, w2);
  QuantSettings settings;
  settings.format = "nf4";
  settings.skip = {"out"};
  StatusOr<QuantizeReport> report = QuantizeModule(net, settings);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->layers_quantized, 1);
  EXPECT_EQ(report->layers_skipped, 1);
  EXPECT_EQ(net.attr("proj_out").toModule().attr("weight").toTensor().scalar_type(), at::kFloat);
  EXPECT_EQ(net.attr("proj_in").toModule().attr("weight").toTensor().scalar_type(), at::kByte);

  settings.skip = {"proj"};
  StatusOr<QuantizeReport> none_left = QuantizeModule(net, settings);
  ASSERT_FALSE(none_left.ok());
  EXPECT_NE(none_left.status().message().find("no quantizable layers"), std::string::npos);
}

// Note [Small layers stay float]: proj_in has 48 x 40 = 1920 weights, proj_out 16 x 48 = 768.
TEST(ModuleQuantizer, MinWeightsKeepsSmallLayersFloat) {
  torch::manual_seed(15);
  at::Tensor w1 = at::randn({48, 40}), b1 = at::randn({48}), w2 = at::randn({16, 48});
  torch::jit::Module net = MakeNet(w1, b1, w2);
  const at::Tensor x = at::randn({20, 40});
  QuantSettings settings;
  settings.format = "w8a8";
  settings.min_weights = 1920;  // proj_in is not below it
  StatusOr<QuantizeReport> report = QuantizeModule(net, settings);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->layers_quantized, 1);
  EXPECT_EQ(report->layers_skipped, 0);
  EXPECT_EQ(report->layers_small, 1);
  EXPECT_EQ(report->quantized, (std::vector<std::string>{"proj_in"}));
  EXPECT_EQ(net.attr("proj_in").toModule().attr("weight").toTensor().scalar_type(), at::kChar);
  EXPECT_TRUE(at::equal(net.attr("proj_out").toModule().attr("weight").toTensor(), w2));
  // The float layer computes as before, the quantized one as the quantizer's state does.
  const QuantState s = *QuantizeW8A8(w1);
  const at::Tensor expected = at::linear(at::relu(QuantLinear(x, s, b1)), w2);
  EXPECT_TRUE(at::allclose(Forward(net, x), expected, 1e-5, 1e-5));

  // Every layer small: the component stays float as a whole, unchanged, and that is no error.
  torch::jit::Module again = MakeNet(w1, b1, w2);
  settings.min_weights = 1921;
  StatusOr<QuantizeReport> all_small = QuantizeModule(again, settings);
  ASSERT_TRUE(all_small.ok()) << all_small.status().ToString();
  EXPECT_EQ(all_small->layers_quantized, 0);
  EXPECT_EQ(all_small->layers_small, 2);
  EXPECT_TRUE(at::equal(again.attr("proj_in").toModule().attr("weight").toTensor(), w1));
  EXPECT_TRUE(
      at::allclose(Forward(again, x), at::linear(at::relu(at::linear(x, w1, b1)), w2), 1e-5, 1e-5));

  // `skip` leaving nothing is still a mistake in the manifest.
  settings.min_weights = 0;
  settings.skip = {"proj"};
  StatusOr<QuantizeReport> none_left = QuantizeModule(again, settings);
  ASSERT_FALSE(none_left.ok());
  EXPECT_NE(none_left.status().message().find("left after skip (2 skipped)"), std::string::npos)
      << none_left.status().message();
}

TEST(ModuleQuantizer, RefusesBadSettingsAndPlainModules) {
  torch::jit::Module net = MakeNet(at::randn({8, 8}), at::randn({8}), at::randn({4, 8}));
  QuantSettings bad_format;
  bad_format.format = "fp8";
  EXPECT_EQ(QuantizeModule(net, bad_format).status().code(), StatusCode::kInvalidArgument);
  QuantSettings bad_bs;
  bad_bs.format = "nf4";
  bad_bs.blocksize = 24;
  StatusOr<QuantizeReport> r = QuantizeModule(net, bad_bs);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("power of two"), std::string::npos);
  EXPECT_EQ(net.attr("proj_in").toModule().attr("weight").toTensor().scalar_type(), at::kFloat);

  QuantSettings none;
  EXPECT_EQ(QuantizeModule(net, none)->layers_quantized, 0);

  torch::jit::Module plain("__torch__.qpool_test.Plain");
  plain.register_parameter("weight", at::randn({4, 4}), false);
  plain.define("def forward(self, x):\n    return torch.matmul(x, self.weight)\n");
  QuantSettings int8;
  int8.format = "int8";
  StatusOr<QuantizeReport> p = QuantizeModule(plain, int8);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("no quantizable layers"), std::string::npos);
}

TEST(ModuleQuantizer, ClassifiesQuantStateNames) {
  for (const char* n :
       {"absmax", "code", "nested_absmax", "nested_code", "offset", "down.0.proj.absmax"}) {
    EXPECT_TRUE(qpool::IsQuantStateName(n)) << n;
  }
  for (const char* n : {"weight", "bias", "proj.weight", "running_mean", "codebook"}) {
    EXPECT_FALSE(qpool::IsQuantStateName(n)) << n;
  }
}

// Note [Python cross-check]: tests/python/test_quant.py --write-golden writes traced QuantLinear
// modules (pre-quantized, with the reference input and output as buffers) and their float
// twins. The C++ op must reproduce the outputs (w8a8's int8 product: exactly), and the C++
// load-time quantizer the exact bytes (w8a8 with calibrated activation scales has no twin).
std::string FindPython() {
  if (const char* env = std::getenv("QPOOL_PYTHON")) return env;
  const std::string venv = testing::SourceDir() + "/.venv/bin/python";
  return std::filesystem::exists(venv) ? venv : "";
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(PythonReference, CppOpAndQuantizerReproduceThePythonReference) {
  const std::string python = FindPython();
  if (python.empty()) GTEST_SKIP() << "no Python with torch (set QPOOL_PYTHON)";
  const std::string dir = testing::MakeTempDir("quant-golden");
  const std::string log = dir + "/writer.log";
  const std::string cmd = "'" + python + "' '" + testing::SourceDir() +
                          "/tests/python/test_quant.py' --write-golden '" + dir + "' > '" + log +
                          "' 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    const std::string out = ReadAll(log);
    if (out.find("No module named 'torch'") != std::string::npos) GTEST_SKIP() << out;
    FAIL() << cmd << "\n" << out;
  }
  std::ifstream cases(dir + "/cases.txt");
  std::string name, format;
  int blocksize = 0, dq = 0, calibrated = 0, count = 0;
  while (cases >> name >> format >> blocksize >> dq >> calibrated) {
    SCOPED_TRACE(name);
    ++count;
    torch::jit::Module pre = torch::jit::load(dir + "/" + name + ".pt");
    const at::Tensor x = pre.attr("x_ref").toTensor();
    const at::Tensor y_ref = pre.attr("y_ref").toTensor();
    const at::Tensor y = pre.forward({x}).toTensor();
    EXPECT_EQ(y.scalar_type(), y_ref.scalar_type());
    EXPECT_TRUE(at::allclose(y.to(at::kFloat), y_ref.to(at::kFloat), 1e-5, 1e-5))
        << (y.to(at::kFloat) - y_ref.to(at::kFloat)).abs().max().item<float>();
    const int64_t k = x.size(-1);
    if (format == "w8a8" && W8A8IntMatmulRuns(x.numel() / k, k, y.size(-1))) {
      EXPECT_TRUE(at::equal(y, y_ref)) << "the int8 product differs from quant.py's";
    }
    if (calibrated) continue;

    torch::jit::Module fl = torch::jit::load(dir + "/" + name + "_float.pt");
    QuantSettings settings;
    settings.format = format;
    settings.blocksize = blocksize;
    settings.double_quant = dq != 0;
    StatusOr<QuantizeReport> report = QuantizeModule(fl, settings);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->layers_quantized, format == "none" ? 0 : 1);
    torch::jit::Module a = pre.attr("layer").toModule(), b = fl.attr("layer").toModule();
    for (const char* attr :
         {"weight", "absmax", "code", "nested_absmax", "nested_code", "offset"}) {
      const at::Tensor ta = a.attr(attr).toTensor(), tb = b.attr(attr).toTensor();
      EXPECT_EQ(ta.scalar_type(), tb.scalar_type()) << attr;
      EXPECT_EQ(ta.sizes(), tb.sizes()) << attr;
      EXPECT_TRUE(ta.sizes() == tb.sizes() && at::equal(ta, tb)) << attr << " differs";
    }
    EXPECT_TRUE(at::equal(fl.forward({x}).toTensor(), y));
  }
  EXPECT_EQ(count, 9);
  // Not std::filesystem::remove_all: in a process with libtorch 2.11 loaded it resolves to a
  // broken copy exported by libtorch.so and crashes.
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

}  // namespace
}  // namespace qpool::quant
