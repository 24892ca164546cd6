// Component::Load refuses component files it cannot serve with INVALID_ARGUMENT naming the file,
// whatever LibTorch throws while reading them (Note [Load errors]); each case here once left the
// load as an exception, failed only at placement or cost gigabytes (found by fuzz/fuzz_component).
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "component/component.h"
#include "testing/test_paths.h"
#include "util/model_file.h"

namespace qpool {
namespace {

std::string SaveModule(const torch::jit::Module& m, const std::string& tag) {
  const std::string path = testing::MakeTempDir(tag) + "/component.pt";
  m.save(path);
  return path;
}

// A module of TorchScript class `type` whose forward returns its input.
torch::jit::Module Passthrough(const std::string& type) {
  torch::jit::Module m(type);
  m.define(R"JIT(
    def forward(self, latents):
        return latents
  )JIT");
  return m;
}

void ExpectRefused(const StatusOr<std::unique_ptr<Component>>& c, const std::string& path,
                   const std::string& why) {
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().ToString();
  EXPECT_NE(c.status().message().find(path), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find(why), std::string::npos) << c.status().message();
}

// It loaded, and the kind's signature check then threw reading forward's schema.
TEST(ComponentLoad, RefusesAModuleWithoutForward) {
  torch::jit::Module m("NoForward");
  m.register_parameter("weight", torch::ones({4}), /*is_buffer=*/false);
  m.define(R"JIT(
    def decode(self, latents):
        return latents * self.weight
  )JIT");
  const std::string path = SaveModule(m, "component-no-forward");
  ExpectRefused(Component::Load("vae_decoder", path), path, "has no forward method");
}

// A copy of the TorchScript file `from` whose source files hold `code`, with `debug_pickle` as
// their debug pickles where it is not empty, written to `to`.
void ReplaceCode(const std::string& from, const std::string& code, const std::string& to,
                 const std::string& debug_pickle = "") {
  caffe2::serialize::PyTorchStreamReader reader(from);
  caffe2::serialize::PyTorchStreamWriter writer(to);
  writer.setMinVersion(reader.version());
  for (const std::string& name : reader.getAllRecords()) {
    // The writer adds its own version and id; the debug pickles describe the old code.
    if (name == "version" || name == ".data/version" || name == ".data/serialization_id" ||
        name.find(".debug_pkl") != std::string::npos) {
      continue;
    }
    if (name.rfind("code/", 0) == 0) {
      writer.writeRecord(name, code.data(), code.size());
      if (!debug_pickle.empty()) {
        writer.writeRecord(name + ".debug_pkl", debug_pickle.data(), debug_pickle.size());
      }
      continue;
    }
    auto [data, size] = reader.getRecord(name);
    writer.writeRecord(name, data.get(), size);
  }
  writer.writeEndOfFile();
}

// A Passthrough("Decoder") saved under `tag`, rewritten with code that does not compile (and
// `debug_pickle` as its debug pickles where not empty) as vae_decoder.pt beside it; its path.
std::string DecoderWithBrokenCode(const std::string& tag, const std::string& debug_pickle = "") {
  const std::string valid = SaveModule(Passthrough("Decoder"), tag);
  const std::string path = valid.substr(0, valid.rfind('/')) + "/vae_decoder.pt";
  ReplaceCode(valid, "class Decoder(Module):\n  def forward(self, latents) -> Tensor:\n    %%%\n",
              path, debug_pickle);
  return path;
}

// The process's peak resident memory so far, in bytes.
uint64_t PeakRss() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;
}

// TorchScript's compiler reports errors in the file's code as torch::jit::ErrorReport, which is no
// c10::Error.
TEST(ComponentLoad, RefusesCodeThatDoesNotCompile) {
  const std::string path = DecoderWithBrokenCode("component-bad-code");
  ExpectRefused(Component::Load("vae_decoder", path), path, "cannot load TorchScript component");
}

// LibTorch reads a file's debug pickles to point at an error in its code, and trusts them: this
// one's first string claims 2 GiB, which LibTorch allocated and filled before finding the file
// shorter. The load does not read them.
TEST(ComponentLoad, DoesNotReadDebugPickles) {
  // Protocol 2, BINUNICODE of 0x7ffffff0 bytes, and no more.
  const std::string path =
      DecoderWithBrokenCode("component-debug-pickle", std::string("\x80\x02X\xf0\xff\xff\x7f", 7));
  const uint64_t before = PeakRss();
  ExpectRefused(Component::Load("vae_decoder", path), path, "cannot load TorchScript component");
  EXPECT_LT(PeakRss() - before, uint64_t{256} << 20);
}

// A dtype the residency has no copy for failed the placement as INTERNAL, naming no file.
TEST(ComponentLoad, RefusesTensorsItCannotPlace) {
  torch::jit::Module m = Passthrough("SubByte");
  m.register_buffer("bits", torch::empty({8}, torch::dtype(c10::ScalarType::Int1)));
  const std::string path = SaveModule(m, "component-int1");
  ExpectRefused(Component::Load("vae_decoder", path), path, "tensor 'bits' is a Strided Int1");
}

// LibTorch's loader takes a tensor's sizes and strides from the file as they are; the placement's
// copy of one larger than its storage read past the end of the storage's heap block.
TEST(ComponentLoad, RefusesTensorsBeyondTheirStorage) {
  torch::jit::Module m = Passthrough("Decoder");
  torch::Tensor table = torch::zeros({4});  // a storage of 16 bytes
  table.unsafeGetTensorImpl()->set_sizes_contiguous({1024});
  m.register_buffer("table", table);
  const std::string path = SaveModule(m, "component-beyond-storage");
  ExpectRefused(Component::Load("vae_decoder", path), path,
                "tensor 'table' of sizes [1024], strides [1] and offset 0 reaches beyond its "
                "storage of 16 bytes");
}

// A Decoder whose forward returns `expression` (of `latents`), saved under `tag`; its path.
std::string DecoderReturning(const std::string& tag, const std::string& expression) {
  const std::string valid = SaveModule(Passthrough("Decoder"), tag);
  const std::string path = valid.substr(0, valid.rfind('/')) + "/vae_decoder.pt";
  ReplaceCode(valid,
              "class Decoder(Module):\n  def forward(self, latents: Tensor) -> Tensor:\n"
              "    return " + expression + "\n",
              path);
  return path;
}

std::string Repeat(const std::string& piece, size_t times) {
  std::string out;
  for (size_t i = 0; i < times; ++i) out += piece;
  return out;
}

// TorchScript's parser recurses once per level: 100,000 nested parentheses overflowed the stack
// (SIGSEGV, the whole server down). Each shape of deep recursion is refused before it parses,
// naming the file and the record (Note [Script source limits]).
TEST(ComponentLoad, RefusesSourceThatNestsTooDeep) {
  const size_t deep = 100000;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {Repeat("(", deep) + "latents" + Repeat(")", deep), "brackets nest too deep"},
      {Repeat("-", deep) + "latents", "an expression of too many operators"},
      {"latents" + Repeat(" + latents", deep), "an expression of too many operators"},
      {"latents" + Repeat("[0]", deep), "an expression of too many operators"},
      {"latents" + Repeat(".T", deep), "an expression of too many operators"},
      {Repeat("not ", deep) + "latents", "an expression of too many operators"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = DecoderReturning("component-deep-" + std::to_string(i),
                                              cases[i].first);
    const auto c = Component::Load("vae_decoder", path);
    ExpectRefused(c, path, cases[i].second);
    EXPECT_NE(c.status().message().find("code/__torch__.py line 3"), std::string::npos)
        << c.status().message();
  }
  // Blocks nested deeper than any exporter writes, one indentation level each.
  std::string blocks = "class Decoder(Module):\n  def forward(self, latents: Tensor) -> Tensor:\n";
  for (size_t level = 0; level < 2000; ++level) {
    blocks += std::string(4 + level, ' ') + "if bool(latents.sum() > 0):\n";
  }
  blocks += std::string(4 + 2000, ' ') + "pass\n    return latents\n";
  const std::string valid = SaveModule(Passthrough("Decoder"), "component-deep-blocks");
  const std::string path = valid.substr(0, valid.rfind('/')) + "/vae_decoder.pt";
  ReplaceCode(valid, blocks, path);
  ExpectRefused(Component::Load("vae_decoder", path), path, "blocks nest too deep");
}

// Writes `valid`'s records to a vae_decoder.pt beside it, each as `edit` leaves it (and deflated
// when it says so); the path written.
std::string RewriteRecords(
    const std::string& valid,
    const std::function<void(const std::string& name, std::string& bytes, bool& deflate)>& edit) {
  const std::string path = valid.substr(0, valid.rfind('/')) + "/vae_decoder.pt";
  caffe2::serialize::PyTorchStreamReader reader(valid);
  caffe2::serialize::PyTorchStreamWriter writer(path);
  writer.setMinVersion(reader.version());
  for (const std::string& name : reader.getAllRecords()) {
    if (name == "version" || name == ".data/version" || name == ".data/serialization_id") {
      continue;
    }
    auto [data, size] = reader.getRecord(name);
    std::string bytes(static_cast<const char*>(data.get()), size);
    bool deflate = false;
    edit(name, bytes, deflate);
    writer.writeRecord(name, bytes.data(), bytes.size(), deflate);
  }
  writer.writeEndOfFile();
  return path;
}

// A 5 MB file whose records inflate to 1 GiB cost that much before failing: records that
// torch.jit.save stores, deflated so that they inflate beyond the file, are refused unread.
TEST(ComponentLoad, RefusesRecordsThatInflateBeyondTheFile) {
  const std::string path = RewriteRecords(
      SaveModule(Passthrough("Decoder"), "component-inflating"),
      [](const std::string& name, std::string& bytes, bool& deflate) {
        deflate = name == "data.pkl";
        if (deflate) bytes.resize(size_t{64} << 20);  // the pickle, then 64 MiB of zeros
      });
  ASSERT_LT(std::filesystem::file_size(path), uintmax_t{1} << 20);
  ExpectRefused(Component::Load("vae_decoder", path), path, "records inflate to more than");
}

// A 38 KB data.pkl claiming a 3 GiB string cost 3 GiB before the load failed: the pickle's
// lengths are checked against the record first (Note [Pickle bounds]).
TEST(ComponentLoad, RefusesPickleLengthsBeyondTheRecord) {
  const std::string path = RewriteRecords(
      SaveModule(Passthrough("Decoder"), "component-pickle-length"),
      [](const std::string& name, std::string& bytes, bool& /*deflate*/) {
        // Protocol 2, then BINUNICODE claiming 0xc0000000 bytes (3 GiB), and 38 KB of them.
        if (name == "data.pkl") {
          bytes = std::string("\x80\x02X\x00\x00\x00\xc0", 7) + std::string(38 << 10, 'x');
        }
      });
  const uint64_t before = PeakRss();
  ExpectRefused(Component::Load("vae_decoder", path), path,
                "data.pkl byte 2: a length of 3221225472 bytes");
  EXPECT_LT(PeakRss() - before, uint64_t{256} << 20);
}

// Note [One descriptor per file]: a file renamed over the component after it was opened (and
// hashed) is not what loads.
TEST(ComponentLoad, ReadsTheFileOpenedThoughAnotherIsRenamedOverIt) {
  const std::string path = DecoderReturning("component-swapped", "latents");
  const std::string other = DecoderReturning("component-swapped-in", "latents * 2.0");
  auto file = ModelFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_EQ(std::rename(other.c_str(), path.c_str()), 0);
  auto c = Component::Load("vae_decoder", **file);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c.value()->module().forward({torch::ones({2})}).toTensor().equal(torch::ones({2})));
  EXPECT_FALSE((*file)->CheckUnchanged().ok());
}

// What stays inside the bounds loads and runs: nesting as exporters write it, and strings and
// comments holding brackets and operators, which are no part of an expression.
TEST(ComponentLoad, LoadsSourceInsideTheBounds) {
  const std::string path = DecoderReturning(
      "component-nested-ok", Repeat("(", 150) + "latents" + Repeat(")", 150) +
                                 " + float(len(\"((((((((--[[[[\")) * 0  # ((((((( - - - -");
  auto c = Component::Load("vae_decoder", path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c.value()->module().forward({torch::ones({2})}).toTensor().equal(torch::ones({2})));
}

}  // namespace
}  // namespace qpool
