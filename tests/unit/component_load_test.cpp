// Component::Load refuses component files it cannot serve with INVALID_ARGUMENT naming the file,
// whatever LibTorch throws while reading them (Note [Load errors]); each case here once left the
// load as an exception or failed only at placement (found by fuzz/fuzz_component).
#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>

#include "component/component.h"
#include "testing/test_paths.h"

namespace qpool {
namespace {

std::string SaveModule(const torch::jit::Module& m, const std::string& tag) {
  const std::string path = testing::MakeTempDir(tag) + "/component.pt";
  m.save(path);
  return path;
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

// A copy of the TorchScript file `from` whose source files hold `code`, written to `to`.
void ReplaceCode(const std::string& from, const std::string& code, const std::string& to) {
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
      continue;
    }
    auto [data, size] = reader.getRecord(name);
    writer.writeRecord(name, data.get(), size);
  }
  writer.writeEndOfFile();
}

// TorchScript's compiler reports errors in the file's code as torch::jit::ErrorReport, which is no
// c10::Error.
TEST(ComponentLoad, RefusesCodeThatDoesNotCompile) {
  torch::jit::Module m("Decoder");
  m.define(R"JIT(
    def forward(self, latents):
        return latents
  )JIT");
  const std::string valid = SaveModule(m, "component-bad-code");
  const std::string path = valid.substr(0, valid.rfind('/')) + "/vae_decoder.pt";
  ReplaceCode(valid, "class Decoder(Module):\n  def forward(self, latents) -> Tensor:\n    %%%\n",
              path);
  ExpectRefused(Component::Load("vae_decoder", path), path, "cannot load TorchScript component");
}

// A dtype the residency has no copy for failed the placement as INTERNAL, naming no file.
TEST(ComponentLoad, RefusesTensorsItCannotPlace) {
  torch::jit::Module m("SubByte");
  m.register_buffer("bits", torch::empty({8}, torch::dtype(c10::ScalarType::Int1)));
  m.define(R"JIT(
    def forward(self, latents):
        return latents
  )JIT");
  const std::string path = SaveModule(m, "component-int1");
  ExpectRefused(Component::Load("vae_decoder", path), path, "tensor 'bits' is a Strided Int1");
}

}  // namespace
}  // namespace qpool
