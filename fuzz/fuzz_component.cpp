// fuzz_component: arbitrary bytes as a component file that a manifest names without a sha256, so
// that nothing checks them before LibTorch does, through the load a pipeline runs for each of its
// components (Pipeline::LoadComponents): Component::Load (torch::jit::load of a TorchScript zip
// and the checks of Note [Load errors] and Note [No tensor constants]), the signature check
// against what a kind declares for the component (Note [Component signatures]) and placement on
// the CPU. A refused file must give INVALID_ARGUMENT naming it; an exception out of the load, a
// crash, a sanitizer report or a leak is a finding.
//
// The declaration checked is one of every builtin kind's components (PipelineKinds::Builtin): the
// one at the input's size modulo their number, so that a mutation that inserts or removes bytes
// checks the same module against another role.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "memory/arena_allocator.h"
#include "pipeline/pipeline.h"
#include "pipeline/pipeline_kind.h"
#include "pipeline/pipeline_kinds.h"
#include "residency/block_copy.h"

namespace fs = std::filesystem;

namespace qpool::fuzz {
namespace {

// A kind that declares one component of a builtin kind, as that kind declares it.
class OneComponentKind final : public PipelineKind {
 public:
  OneComponentKind(const PipelineKind& kind, const ComponentDecl& decl)
      : name_(kind.name()), components_{decl} {}
  const std::string& name() const override { return name_; }
  const std::vector<ComponentDecl>& components() const override { return components_; }
  double default_working_bytes_per_pixel() const override { return 1; }
  StatusOr<std::unique_ptr<Pipeline>> Load(const PipelineManifest&, const c10::Device&,
                                           c10::ScalarType,
                                           const ResidencyContext&) const override {
    return Internal("OneComponentKind loads through ComponentLoad");
  }

 private:
  const std::string name_;
  const std::vector<ComponentDecl> components_;
};

// A pipeline that only loads and places its kind's components, as every kind's Load does.
class ComponentLoad final : public Pipeline {
 public:
  ComponentLoad(const PipelineKind& kind, PipelineManifest manifest)
      : Pipeline(kind, std::move(manifest), c10::kFloat) {}
  Status Run(const ResidencyContext& residency) {
    return LoadComponents(c10::Device(c10::kCPU), residency);
  }
  void GenerateBatch(std::vector<BatchItem> items) override {
    for (auto& item : items) item.done(Internal("not run"));
  }
  StatusOr<EncodeOutput> Encode(const std::vector<std::string>&) override {
    return Internal("not run");
  }
};

// Every component declaration of every builtin kind, with its kind, and a pipeline folder in a
// temporary directory (removed at exit) whose component file each input is written to.
class Harness {
 public:
  Harness() : kinds_(PipelineKinds::Builtin()) {
    for (const auto& [name, spec] : kinds_->Catalog()) {
      const PipelineKind* kind = kinds_->Find(name);
      for (const ComponentDecl& decl : kind->components()) {
        roles_.push_back(std::make_unique<OneComponentKind>(*kind, decl));
      }
    }
    std::string pattern = (fs::temp_directory_path() / "qpool-fuzz-component-XXXXXX").string();
    FUZZ_CHECK(mkdtemp(pattern.data()) != nullptr, "mkdtemp");
    root_ = pattern;
    fs::create_directories(root_ + "/fuzz");
  }
  ~Harness() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // The kind that declares the component `size` selects.
  const PipelineKind& RoleFor(size_t size) const { return *roles_[size % roles_.size()]; }
  // The manifest of a pipeline of `kind` whose one component is `file`, without a digest.
  PipelineManifest Manifest(const PipelineKind& kind, const std::string& file) const {
    PipelineManifest m;
    m.name = "fuzz";
    m.kind = kind.name();
    m.dir = root_ + "/fuzz";
    m.path = m.dir + "/pipeline.yaml";
    ComponentSpec spec;
    spec.name = kind.components()[0].name;
    spec.file = file;
    m.components.push_back(spec);
    return m;
  }
  std::string FileFor(const PipelineKind& kind) const {
    return root_ + "/fuzz/" + kind.components()[0].name + ".pt";
  }
  ResidencyContext residency() { return ResidencyContext{&arenas_, &copier_, nullptr, nullptr}; }

 private:
  std::shared_ptr<const PipelineKinds> kinds_;
  std::vector<std::unique_ptr<OneComponentKind>> roles_;
  std::string root_;
  ArenaAllocator arenas_;
  BlockCopier copier_;
};

}  // namespace
}  // namespace qpool::fuzz

// LeakSanitizer's suppressions for this target: leaks of LibTorch's own that no caller can avoid
// (README.md: Findings). PyTorchStreamReader's constructor opens the zip (mz_zip_reader_init) and
// then checks the archive (no files, an unsupported version, ...); when a check throws, its
// destructor does not run and the zip reader's state is never freed.
extern "C" const char* __lsan_default_suppressions() { return "leak:mz_zip_reader_init\n"; }
// Without the table of suppressions used after every leak check.
extern "C" const char* __lsan_default_options() { return "print_suppressions=0"; }

// AddressSanitizer's options for this target. LibTorch's unpickler allocates and fills as many
// bytes as a string's length in the pickle says before reading them (README.md: Findings), so a
// file of a few KB costs up to 4 GiB. Allocations over 256 MiB fail here, as they would in a
// server without that much to spare (std::bad_alloc from bounded_new.cpp's operator new, which
// the load turns into INVALID_ARGUMENT), instead of running the fuzzer out of memory; an
// allocation of ours sized by the file fails the same way and shows as the status it becomes.
extern "C" const char* __asan_default_options() {
  return "max_allocation_size_mb=256:allocator_may_return_null=1";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qpool;
  static fuzz::Harness harness;

  const PipelineKind& kind = harness.RoleFor(size);
  const std::string file = harness.FileFor(kind);
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    FUZZ_CHECK(out.good(), "cannot write " + file);
  }
  Status status;
  try {
    fuzz::ComponentLoad pipeline(kind, harness.Manifest(kind, file));
    status = pipeline.Run(harness.residency());
    if (status.ok()) {
      FUZZ_CHECK(pipeline.components().size() == 1, "one component loaded");
      FUZZ_CHECK(pipeline.components()[0]->device().is_cpu(), "placed on the CPU");
    }
  } catch (const std::exception& e) {
    FUZZ_CHECK(false, "exception out of the load of " + file + ": " + e.what());
  } catch (...) {
    FUZZ_CHECK(false, "non-standard exception out of the load of " + file);
  }
  if (!status.ok()) {
    FUZZ_CHECK(status.code() == StatusCode::kInvalidArgument, status.ToString());
    FUZZ_CHECK(status.message().find(file) != std::string::npos,
               "error does not name the file: " + status.message());
  }
  return 0;
}
