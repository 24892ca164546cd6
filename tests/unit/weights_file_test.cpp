// A component's weights file (Note [Weights beside the graph]): bound into the graph's
// placeholders when it fits them exactly, refused naming the file and the tensor otherwise, with
// nothing bound; a graph whose placeholders stay unbound is refused.
#include "component/weights_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "component/component.h"
#include "testing/test_paths.h"
#include "util/model_file.h"

namespace qpool {
namespace {

struct Entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

std::string HeaderJson(const std::vector<Entry>& entries) {
  std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
  for (const Entry& e : entries) {
    json += ",\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) json += (i ? "," : "") + std::to_string(e.shape[i]);
    json += "],\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
  }
  return json + "}";
}

// A safetensors file of `header` (its length first, little-endian) and `data`.
std::string WriteFile(const std::string& tag, const std::string& header, const std::string& data) {
  const std::string path = testing::MakeTempDir(tag) + "/unet.safetensors";
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
  return path;
}

std::string Bytes(const torch::Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
}

// The graph the importer writes: a weight and a float32 quant-state buffer as placeholders.
std::unique_ptr<Component> PlaceholderComponent() {
  torch::jit::Module m("Layer");
  m.register_parameter("weight", torch::zeros({}, torch::kHalf).expand({3, 4}), false);
  m.register_buffer("absmax", torch::zeros({}).expand({3}));
  m.define(R"JIT(
    def forward(self, x):
        return x.matmul(self.weight.float().t()) * self.absmax
  )JIT");
  const std::string path = testing::MakeTempDir("weights-graph") + "/unet.pt";
  m.save(path);
  StatusOr<std::unique_ptr<Component>> c = Component::Load("unet", path);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(*c);
}

const torch::Tensor kWeight = torch::arange(12, torch::kHalf).reshape({3, 4});
const torch::Tensor kAbsmax = torch::tensor({1.0f, 2.0f, 3.0f});

// The file save_split writes: the float32 tensor first (element size, largest first).
std::vector<Entry> GoodEntries() {
  return {{"absmax", "F32", {3}, 0, 12}, {"weight", "F16", {3, 4}, 12, 36}};
}
std::string GoodData() { return Bytes(kAbsmax) + Bytes(kWeight); }

Status Bind(Component& c, const std::string& path) {
  StatusOr<std::unique_ptr<ModelFile>> file = ModelFile::Open(path);
  if (!file.ok()) return file.status();
  return BindWeights(c, **file);
}

TEST(WeightsFile, BindsEveryTensorIntoItsSlot) {
  auto c = PlaceholderComponent();
  ASSERT_FALSE(CheckHoldsData("unet.pt", *c).ok());
  const std::string path = WriteFile("weights-good", HeaderJson(GoodEntries()), GoodData());
  ASSERT_TRUE(Bind(*c, path).ok()) << Bind(*c, path).ToString();
  EXPECT_TRUE(CheckHoldsData("unet.pt", *c).ok());
  const std::vector<torch::Tensor> t = c->Tensors();
  ASSERT_EQ(c->slot_name(0), "weight");
  EXPECT_TRUE(torch::equal(t[0], kWeight));
  EXPECT_TRUE(torch::equal(t[1], kAbsmax));
  auto out = c->Forward({torch::ones({2, 4})});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(
      torch::allclose(*out, torch::ones({2, 4}).matmul(kWeight.to(torch::kFloat).t()) * kAbsmax));
}

TEST(WeightsFile, AGraphWithUnboundPlaceholdersIsRefused) {
  auto c = PlaceholderComponent();
  const Status s = CheckHoldsData("/m/tiny/unet.pt", *c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("/m/tiny/unet.pt: tensor 'weight' of sizes [3, 4] is a placeholder"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("components.unet.weights"), std::string::npos) << s.message();
}

struct BadFile {
  const char* what;
  std::string header;
  std::string data;
  const char* message;
};

std::vector<BadFile> BadFiles() {
  std::vector<Entry> e = GoodEntries();
  auto with = [&](auto edit) {
    std::vector<Entry> copy = GoodEntries();
    edit(copy);
    return HeaderJson(copy);
  };
  const std::string data = GoodData();
  return {
      {"missing tensor", HeaderJson({e[0]}), Bytes(kAbsmax), "holds no tensor 'weight'"},
      {"extra tensor", with([](auto& v) {
         v.push_back({"bias", "F16", {3}, 36, 42});
       }),
       data + std::string(6, '\0'), "holds tensor 'bias', which component 'unet' has no slot"},
      {"another dtype", with([](auto& v) { v[1].dtype = "BF16"; }), data,
       "tensor 'weight' is BFloat16 of sizes [3, 4]; component 'unet' has Half"},
      {"other sizes", with([](auto& v) {
         v[1].shape = {4, 3};
       }),
       data, "tensor 'weight' is Half of sizes [4, 3]"},
      {"cut short", HeaderJson(e), data.substr(0, 30), "the file is cut short"},
      {"bytes after the last tensor", HeaderJson(e), data + "xx", "bytes follow the last tensor"},
      {"overlap", with([](auto& v) { v[1].begin = 10, v[1].end = 34; }), data.substr(0, 34),
       "overlaps the tensor before it"},
      {"hole", with([](auto& v) { v[1].begin = 14, v[1].end = 38; }), data + "xx", "leaves a hole"},
      {"range not the sizes' bytes", with([](auto& v) { v[1].end = 30; }), data.substr(0, 30),
       "data_offsets [12, 30], not the 24 bytes"},
      {"unknown dtype", with([](auto& v) { v[1].dtype = "I4"; }), data, "has dtype 'I4'"},
      {"sizes past any file", with([](auto& v) {
         v[1].shape = {1LL << 40, 1LL << 40};
       }),
       data, "of more bytes than a file holds"},
      {"not JSON", "{\"weight\": [", data, "is not a JSON object"},
      {"unknown field",
       "{\"weight\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[0,2],"
       "\"x\":1}}",
       "ab", "unknown field 'x'"},
  };
}

TEST(WeightsFile, RefusesFilesThatDoNotFitAndBindsNothing) {
  for (const BadFile& bad : BadFiles()) {
    SCOPED_TRACE(bad.what);
    auto c = PlaceholderComponent();
    const std::string path = WriteFile("weights-bad", bad.header, bad.data);
    const Status s = Bind(*c, path);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(bad.message), std::string::npos) << s.message();
    EXPECT_FALSE(CheckHoldsData("unet.pt", *c).ok()) << "a refused file bound tensors";
  }
}

// T5's token embedding is one tensor in two modules: stored once, both slots get it.
TEST(WeightsFile, TiedSlotsShareTheStoredTensor) {
  torch::jit::Module m("Tied");
  m.register_parameter("first", torch::zeros({}).expand({2, 3}), false);
  m.register_parameter("second", torch::zeros({}).expand({2, 3}), false);
  m.define(R"JIT(
    def forward(self, x):
        return x + self.first + self.second
  )JIT");
  const std::string graph = testing::MakeTempDir("weights-tied-graph") + "/text_encoder_2.pt";
  m.save(graph);
  auto c = Component::Load("text_encoder_2", graph);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const torch::Tensor value = torch::arange(6, torch::kFloat).reshape({2, 3});
  const std::string header =
      "{\"__metadata__\":{\"qpool.tied\":\"{\\\"second\\\": \\\"first\\\"}\"},"
      "\"first\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
  ASSERT_TRUE(Bind(**c, WriteFile("weights-tied", header, Bytes(value))).ok());
  const std::vector<torch::Tensor> t = (*c)->Tensors();
  EXPECT_TRUE(torch::equal(t[0], value));
  EXPECT_EQ(t[0].data_ptr(), t[1].data_ptr());
  // A tie to a tensor the file does not hold binds nothing.
  auto again = Component::Load("text_encoder_2", graph);
  const std::string wrong =
      "{\"__metadata__\":{\"qpool.tied\":\"{\\\"second\\\": \\\"third\\\"}\"},"
      "\"first\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
  const Status s = Bind(**again, WriteFile("weights-tied-wrong", wrong, Bytes(value)));
  EXPECT_NE(s.message().find("ties 'second' to 'third', which it does not hold"), std::string::npos)
      << s.message();
}

TEST(WeightsFile, RefusesAHeaderLengthPastTheFile) {
  auto c = PlaceholderComponent();
  const std::string path = testing::MakeTempDir("weights-length") + "/unet.safetensors";
  std::ofstream(path, std::ios::binary) << std::string("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10);
  const Status s = Bind(*c, path);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("header says it is 4294967295 bytes long"), std::string::npos)
      << s.message();
  const std::string tiny = testing::MakeTempDir("weights-tiny") + "/unet.safetensors";
  std::ofstream(tiny, std::ios::binary) << "abc";
  EXPECT_NE(Bind(*c, tiny).message().find("3 bytes are too few"), std::string::npos);
}

}  // namespace
}  // namespace qpool
