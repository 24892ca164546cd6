// The compiled forward (Note [Compiled forward]): tiny's UNet compiled for the CPU by the
// exporter at build time (test-models/tiny-compiled), bound to the component's own tensors.
#include "component/compiled_forward.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "component/attention_backend.h"
#include "component/component.h"
#include "testing/exported_component.h"
#include "testing/test_paths.h"

namespace qpool {
namespace {

namespace fs = std::filesystem;

class CompiledForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string repo = testing::TinyRepository();
    dir_ = repo.empty() ? "" : repo + "/tiny-compiled";
    if (dir_.empty() || !fs::exists(dir_ + "/unet.cpu.pt2")) {
      GTEST_SKIP() << "test-models/tiny-compiled is missing: build the qpool_test_models target";
    }
    package_ = dir_ + "/unet.cpu.pt2";
  }

  std::unique_ptr<Component> LoadUnet(bool compiled) {
    auto unet = testing::LoadExported("unet", dir_ + "/unet.pt");
    EXPECT_TRUE(unet.ok()) << unet.status().ToString();
    if (compiled) {
      Status attached = (*unet)->AttachCompiled(package_, c10::kCPU, "");
      EXPECT_TRUE(attached.ok()) << attached.ToString();
    }
    return std::move(*unet);
  }

  static std::vector<c10::IValue> Inputs(int64_t batch, int64_t h, int64_t w, uint64_t seed) {
    torch::manual_seed(seed);
    return {torch::randn({batch, 4, h, w}), torch::full({batch}, 321.0f),
            torch::randn({batch, 77, 32})};
  }

  static torch::Tensor Run(Component& c, const std::vector<c10::IValue>& inputs) {
    auto out = c.Forward(inputs);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *out : torch::Tensor();
  }

  // Each constant's binding reads its slot's bytes.
  static void ExpectBoundToSlots(Component& c) {
    CompiledForward* compiled = c.compiled();
    ASSERT_NE(compiled, nullptr);
    ASSERT_TRUE(compiled->bound());
    const auto tensors = c.Tensors();
    std::map<std::string, torch::Tensor> by_name;
    for (size_t i = 0; i < c.num_tensors(); ++i) by_name[c.slot_name(i)] = tensors[i];
    const auto& names = compiled->constant_names();
    ASSERT_EQ(names.size(), compiled->bindings().size());
    for (size_t i = 0; i < names.size(); ++i) {
      ASSERT_EQ(by_name.count(names[i]), 1u) << names[i];
      EXPECT_EQ(compiled->bindings()[i].const_data_ptr(), by_name[names[i]].const_data_ptr())
          << names[i];
    }
  }

  std::string dir_;
  std::string package_;
};

TEST_F(CompiledForwardTest, MatchesTorchScriptAndRunsOnQpoolsTensors) {
  auto plain = LoadUnet(false);
  auto compiled = LoadUnet(true);
  const ComponentBytes before = compiled->Bytes();
  // The exported batch and size, another batch with non-square sides, and odd sides, which the
  // package was not compiled for (sides are multiples of the UNet's down-sampling): TorchScript.
  for (const auto& inputs : {Inputs(2, 8, 8, 1), Inputs(3, 16, 10, 2), Inputs(1, 15, 11, 4)}) {
    const torch::Tensor want = Run(*plain, inputs);
    const torch::Tensor got = Run(*compiled, inputs);
    EXPECT_TRUE(torch::allclose(got, want, 1e-4, 1e-5))
        << "max diff " << (got - want).abs().max().item<float>();
  }
  EXPECT_EQ(compiled->compiled_forwards(), 2u);
  EXPECT_EQ(plain->compiled_forwards(), 0u);
  ExpectBoundToSlots(*compiled);
  // The package holds no weights: the component's bytes are its slots', as without it.
  EXPECT_EQ(compiled->Bytes().total(), before.total());
  EXPECT_EQ(compiled->Bytes().total(), plain->Bytes().total());
  // Note [Compiled attention]: exported on a CPU, under ATen's unsettled order, which is this
  // process's too (nothing here settles a CUDA order).
  EXPECT_EQ(compiled->compiled()->attention(),
            DescribeAttentionPriority(CurrentAttentionPriority()));
}

// A move gives the component new storages: the bindings follow them, and the old storages are
// freed with their last owner (the runtime holds none of qpool's tensors).
TEST_F(CompiledForwardTest, RebindFollowsNewStoragesAndFreesTheOld) {
  auto compiled = LoadUnet(true);
  const auto inputs = Inputs(2, 8, 8, 3);
  const torch::Tensor want = Run(*compiled, inputs);

  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> old;
  std::vector<torch::Tensor> moved;
  {
    const auto tensors = compiled->Tensors();
    for (const auto& t : tensors) {
      old.emplace_back(t.storage().getWeakStorageImpl());
      moved.push_back(t.clone());
    }
  }
  compiled->Rebind(moved, c10::Device(c10::kCPU), c10::kFloat);
  EXPECT_FALSE(compiled->compiled()->bound());  // nothing points at the freed storages
  for (const auto& weak : old) EXPECT_TRUE(weak.expired());

  const torch::Tensor again = Run(*compiled, inputs);
  // Bit equality is not promised: the new storages may be aligned differently.
  EXPECT_TRUE(torch::allclose(again, want, 1e-5, 1e-6))
      << "max diff " << (again - want).abs().max().item<float>();
  EXPECT_EQ(compiled->compiled_forwards(), 2u);
  ExpectBoundToSlots(*compiled);
  // It reads the new storages: after changing them in place it still agrees with TorchScript,
  // which reads the slots, and no longer with the output before.
  // Only the package's constants: a slot it does not list (tiny's 4-element conv_out.bias) was
  // folded into the generated code by the compiler, with the value it had at export.
  const auto& names = compiled->compiled()->constant_names();
  for (size_t i = 0; i < moved.size(); ++i) {
    if (std::binary_search(names.begin(), names.end(), compiled->slot_name(i))) {
      moved[i].add_(0.01);
    }
  }
  const torch::Tensor changed = Run(*compiled, inputs);
  const torch::Tensor scripted = compiled->module().forward(inputs).toTensor();
  EXPECT_TRUE(torch::allclose(changed, scripted, 1e-4, 1e-5))
      << "max diff " << (changed - scripted).abs().max().item<float>();
  EXPECT_FALSE(torch::allclose(changed, want, 1e-4, 1e-5));

  // Unloaded (empty tensors), nothing of the component stays referenced.
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> last;
  for (const auto& t : moved) last.emplace_back(t.storage().getWeakStorageImpl());
  std::vector<torch::Tensor> empty(moved.size(), torch::Tensor());
  compiled->Rebind(empty, c10::Device(c10::kCPU), c10::kFloat);
  moved.clear();
  for (const auto& weak : last) EXPECT_TRUE(weak.expired());
}

// Binding again onto the same addresses (a residency change that put every tensor back where
// it was) keeps nothing allocated: the runtime's pointers are still right, so it is not updated
// (its updates allocate per constant, Note [Compiled forward]).
TEST_F(CompiledForwardTest, RebindingOntoTheSameAddressesAllocatesNothing) {
  auto compiled = LoadUnet(true);
  const auto inputs = Inputs(2, 8, 8, 5);
  std::vector<torch::Tensor> tensors = compiled->Tensors();
  auto rebind = [&] {
    compiled->Rebind(tensors, c10::Device(c10::kCPU), c10::kFloat);
    Run(*compiled, inputs);
  };
  for (int i = 0; i < 20; ++i) rebind();  // the allocator's and the runtime's working set
  const size_t before = mallinfo2().uordblks;
  constexpr int kBinds = 500;
  for (int i = 0; i < kBinds; ++i) rebind();
  const size_t after = mallinfo2().uordblks;
  EXPECT_EQ(compiled->compiled_forwards(), 20u + kBinds);
  // A handle per constant per bind would be about 286 x 500 x 32 bytes (4.5 MB).
  EXPECT_LT(after, before + (256u << 10)) << "heap grew by " << (after - before) << " bytes";
}

// Where the package does not fit, TorchScript answers: inputs outside the compiled signature,
// weights in another dtype than the package's.
TEST_F(CompiledForwardTest, FallsBackToTorchScriptWhereThePackageDoesNotFit) {
  auto plain = LoadUnet(false);
  auto compiled = LoadUnet(true);
  const auto small = Inputs(1, 2, 2, 4);  // latent sides below the compiled minimum
  EXPECT_TRUE(torch::equal(Run(*compiled, small), Run(*plain, small)));
  EXPECT_EQ(compiled->compiled_forwards(), 0u);
  // Why, naming the input, what it is and what the package takes.
  Status refused = compiled->compiled()->Fits(small);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("input 0 is Float[1, 4, 2, 2] on cpu, the package takes Float["),
            std::string::npos)
      << refused.message();
  // A timestep in another dtype than the package's (as a pipeline passing float32 where the
  // exporter compiled float16 would): refused by its position, answered by TorchScript.
  auto wide_step = Inputs(2, 8, 8, 6);
  ASSERT_TRUE(compiled->compiled()->Fits(wide_step).ok());
  wide_step[1] = wide_step[1].toTensor().to(torch::kDouble);
  refused = compiled->compiled()->Fits(wide_step);
  EXPECT_NE(refused.message().find("input 1 is Double[2] on cpu, the package takes Float[1:64]"),
            std::string::npos)
      << refused.message();
  EXPECT_TRUE(torch::allclose(Run(*compiled, wide_step), Run(*plain, wide_step)));
  EXPECT_EQ(compiled->compiled_forwards(), 0u);
  EXPECT_FALSE(compiled->compiled()->Fits({}).ok());

  std::vector<torch::Tensor> doubles;
  for (const auto& t : compiled->Tensors()) doubles.push_back(t.to(torch::kDouble));
  compiled->Rebind(doubles, c10::Device(c10::kCPU), c10::kDouble);
  auto inputs = Inputs(2, 8, 8, 5);
  for (auto& v : inputs) v = v.toTensor().to(torch::kDouble);
  auto out = compiled->Forward(inputs);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->scalar_type(), torch::kDouble);
  EXPECT_FALSE(compiled->compiled()->bound());
  EXPECT_EQ(compiled->compiled_forwards(), 0u);
}

// Bad packages are refused with INVALID_ARGUMENT naming the file.
TEST_F(CompiledForwardTest, BadPackagesAreRefusedNamingTheFile) {
  auto unet = LoadUnet(false);
  auto expect_invalid = [](const Status& s, const std::string& file, const std::string& what) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(file), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  expect_invalid(unet->AttachCompiled(package_, c10::kCPU, std::string(64, '0')), package_,
                 "the manifest records " + std::string(64, '0'));
  expect_invalid(unet->AttachCompiled(package_, c10::kCUDA, ""), package_,
                 "compiled for device 'cpu', the manifest says 'cuda'");
  const std::string missing = dir_ + "/missing.cpu.pt2";
  expect_invalid(unet->AttachCompiled(missing, c10::kCPU, ""), missing, "");
  const std::string tmp = testing::MakeTempDir("compiled");
  const std::string junk = tmp + "/junk.pt2";
  testing::WriteFile(junk, "not a zip");
  expect_invalid(unet->AttachCompiled(junk, c10::kCPU, ""), junk, "cannot open");
  testing::RemoveTree(tmp);
  // Compiled beside another TorchScript file: the VAE decoder's.
  auto vae = Component::Load("vae_decoder", dir_ + "/vae_decoder.pt");
  ASSERT_TRUE(vae.ok());
  expect_invalid((*vae)->AttachCompiled(package_, c10::kCPU, ""), package_,
                 "compiled beside a TorchScript file");
  EXPECT_EQ(unet->compiled(), nullptr);
  EXPECT_EQ((*vae)->compiled(), nullptr);
}

}  // namespace
}  // namespace qpool
