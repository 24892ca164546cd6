// PipelineManifest: the parsed and validated pipeline.yaml of one pipeline folder
// (format: docs/model-repository.md). Torch-free; parsed with yaml-cpp.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/offload_policy.h"
#include "config/scheduler_config.h"
#include "util/status.h"

namespace qpool {

// How one component's linear layers are quantized (at export time or at load time).
struct QuantizationSpec {
  std::string format = "none";    // none | int8 | nf4 | w8a8
  int blocksize = 64;             // nf4 only; power of two in [16, 4096]
  bool double_quant = false;      // nf4 only; 8-bit absmax of absmax
  std::vector<std::string> skip;  // linear layers kept in full precision (name substrings)
  int min_weights = 0;            // float layers with fewer weights (out x in) kept as they are
};

// An ahead-of-time compiled forward of a component (Note [Compiled forward] in
// component/compiled_forward.h): an AOTInductor package without weights, run on the component's
// own tensors while it lives on `device`.
struct CompiledSpec {
  std::string file;    // absolute, lexically normalized path inside the pipeline folder
  std::string device;  // cpu | cuda: the device type the package was compiled for
  std::string sha256;  // as ComponentSpec::sha256; empty: not checked
};

// The tensors of a component in a safetensors file beside its graph (Note [Weights beside the
// graph] in component/weights_file.h).
struct WeightsSpec {
  std::string file;    // absolute, lexically normalized path inside the pipeline folder
  std::string sha256;  // as ComponentSpec::sha256; empty: not checked
};

// One TorchScript component of a pipeline.
struct ComponentSpec {
  std::string name;  // e.g. "unet"
  std::string file;  // absolute, lexically normalized path inside the pipeline folder
  // The file's SHA-256, 64 lowercase hex digits, checked at load (Note [File digests] in
  // util/file_digest.h); empty: not recorded, not checked.
  std::string sha256;
  // components.<name>.weights; none: the graph file holds its tensors (folders imported before
  // graphs and weights were separate).
  std::optional<WeightsSpec> weights;
  QuantizationSpec quantization;
  // The component's floating-point dtype where it differs from the pipeline's (e.g. float32 for
  // a VAE that overflows in float16); empty: placement.dtype.
  std::string dtype;
  std::optional<CompiledSpec> compiled;  // components.<name>.compiled; none: TorchScript only
};

// A tokenizer's files: CLIP's byte-level BPE (vocab.json + merges.txt), a SentencePiece model
// (T5's spiece.model), or an LLM's tokenizer.json, for the sections whose kind says so
// (KindManifestSpec::tokenizer_formats).
struct TokenizerSpec {
  std::string vocab;    // absolute path of vocab.json (CLIP BPE)
  std::string merges;   // absolute path of merges.txt (CLIP BPE)
  std::string model;    // absolute path of the SentencePiece model (SentencePiece)
  std::string json;     // absolute path of tokenizer.json (tokenizer.json)
  int max_length = 77;  // tokens per prompt, padded/truncated; in [2, 1024]
  // What prompts are padded with: <|endoftext|> (SD 1.x's CLIP) or "!" (SD 2.x's OpenCLIP); an
  // LLM's own (Llama 3: <|eot_id|>). Not read for SentencePiece, whose model names it.
  std::string pad_token = "<|endoftext|>";

  // The files it names (those of its format).
  std::vector<std::string> Files() const;
};

// How prompts condition the denoiser, for kinds that read it (the `conditioning` section).
struct ConditioningSpec {
  // With classifier-free guidance and an empty negative prompt, the negative conditioning is
  // zeros instead of the encoded empty prompt (diffusers' force_zeros_for_empty_prompt).
  bool force_zeros_for_empty_prompt = false;
  // hidream: the image tokens a non-square latent's patches are padded to, the padding's keys
  // masked, as the transformer's max_seq (0: non-square images refused). Note [HiDream
  // conditioning].
  int padded_image_tokens = 0;
};

// Latent space of the VAE.
struct LatentSpec {
  int channels = 4;
  int downscale = 8;  // image size / latent size
  double scaling_factor = 0.18215;
  // The decoder gets latents / scaling_factor + shift_factor (FLUX's VAE has one; SD's none).
  double shift_factor = 0.0;
};

// Used when a request leaves a field at 0/empty.
struct GenerationDefaults {
  int steps = 20;
  double guidance_scale = 7.5;
  int width = 512;
  int height = 512;
  std::string scheduler = "ddim";  // one of SamplerNames(the kind's family)
};

// Requests beyond these are INVALID_ARGUMENT.
struct RequestLimits {
  int max_steps = 150;
  int max_width = 1024;
  int max_height = 1024;
  int max_images = 4;
  int max_prompts = 16;  // per Encode call
  // Requests queued or running for the pipeline (all replicas) before RESOURCE_EXHAUSTED: a
  // bounded wait beats an unbounded queue whose clients time out anyway.
  int max_queue = 32;
};

// Where and in which dtype the pipeline runs.
struct Placement {
  // Where replicas may live: auto (the server's devices) | cpu | cuda (every GPU) | cuda:N |
  // a list "cuda:0,cuda:1".
  std::string device = "auto";
  // Replicas loaded by a load without an explicit device, one per device; 0 = "all": one on
  // each device `device` allows. A load naming a device adds a replica there.
  int replicas = 1;
  // Scale-out: when every replica is busy, the router may load more, up to this many, on other
  // devices `device` allows (0 = all of them). Unset: `replicas` (no scale-out).
  int max_replicas = -1;
  std::string dtype = "auto";  // auto (fp16 on CUDA, fp32 on CPU) | float32 | float16 | bfloat16
};

// Dynamic batching (Note [Dynamic batching] in pool/batch_queue.h): concurrent Generate requests
// of one replica with the same size, steps, scheduler and guidance on/off run as one batch.
struct BatchingSpec {
  int max_batch = 1;        // images per batch; 1 turns batching off
  double max_delay_ms = 0;  // how long the oldest request may wait for others to join it
};

// How the pipeline's components run on a GPU.
struct ExecutionSpec {
  // The denoiser's forward is captured once per input shape in a CUDA graph and replayed at
  // every step (Note [Forward graphs] in component/graph_cache.h): a denoising loop is otherwise
  // bound by kernel launches. The text encoders' forwards are too, while the offload policy keeps
  // them on the device between requests (Pipeline::UseEncoderGraphs). Off: every forward launches
  // its kernels one by one.
  bool cuda_graphs = true;
  // Input shapes (sizes, batch) whose graphs the denoiser, and each text encoder, keeps, least
  // recently used dropped first: each holds the activation memory of one forward.
  int max_graphs = 4;
  // Each replica makes one image at the pipeline's defaults before its load ends, so that the
  // first request runs at full speed (Note [Warm-up at load] in pool/pipeline_registry.h).
  bool warmup = false;
};

struct PipelineManifest {
  std::string name;                       // pipeline folder name
  std::string kind;                       // a known kind (KindCatalog)
  std::string dir;                        // absolute pipeline folder
  std::string path;                       // absolute path of pipeline.yaml
  std::vector<ComponentSpec> components;  // the kind's, in its order
  TokenizerSpec tokenizer;
  std::optional<TokenizerSpec> tokenizer_2;  // kinds with a second text encoder (sdxl)
  std::optional<TokenizerSpec> tokenizer_3;  // and a third and fourth (hidream: T5, Llama)
  std::optional<TokenizerSpec> tokenizer_4;
  ConditioningSpec conditioning;
  SchedulerConfig scheduler;
  LatentSpec latent;
  GenerationDefaults defaults;
  RequestLimits limits;
  Placement placement;
  OffloadPolicy offload;  // offload.* (policy, idle_seconds, group_mib, prefetch, resident_mib)
  BatchingSpec batching;
  ExecutionSpec execution;

  // The component called `name`, or nullptr if the pipeline has none.
  const ComponentSpec* FindComponent(const std::string& name) const;
  // tokenizer, then tokenizer_2..4 where the kind has them.
  std::vector<const TokenizerSpec*> Tokenizers() const;
};

// Whether `device` is a valid placement.device: auto, cpu, cuda, cuda:N or "cuda:N,cuda:M,...".
bool IsValidDevice(const std::string& device);

// How a kind's tokenizer section names its files: vocab + merges, model, or json.
enum class TokenizerFormat { kClipBpe, kSentencePiece, kTokenizerJson };

// What a kind's manifests hold besides the sections every kind has.
struct KindManifestSpec {
  std::vector<std::string> components;  // the component names its manifests must list, run order
  // The kind-specific top-level sections it reads: "tokenizer_2", "tokenizer_3", "tokenizer_4"
  // (then required), "conditioning". Manifests of other kinds may not have them.
  std::vector<std::string> sections;
  // Its noise schedule: DDPM betas (scheduler.beta_*; samplers ddim, euler) or flow matching
  // (scheduler.shift and the dynamic shifting fields; sampler euler).
  ScheduleFamily schedule = ScheduleFamily::kDdpm;
  // The format of each tokenizer_N section it reads; CLIP BPE for those not named.
  std::map<std::string, TokenizerFormat> tokenizer_formats;

  // The format of tokenizer section `key`.
  TokenizerFormat TokenizerFormatOf(const std::string& key) const {
    const auto it = tokenizer_formats.find(key);
    return it == tokenizer_formats.end() ? TokenizerFormat::kClipBpe : it->second;
  }
  bool operator==(const KindManifestSpec& o) const {
    return components == o.components && sections == o.sections && schedule == o.schedule &&
           tokenizer_formats == o.tokenizer_formats;
  }
};

// The pipeline kinds a parser accepts, by name (the kinds themselves live in pipeline/:
// PipelineKinds::Catalog).
using KindCatalog = std::map<std::string, KindManifestSpec>;

// Manifests larger than this are refused unread; a real one is a few KB (Note [Manifests without
// aliases] in manifest.cpp).
inline constexpr size_t kMaxManifestBytes = 64 * 1024;

// Parses and validates <pipeline_dir>/pipeline.yaml; its kind must be one of `kinds`. YAML
// aliases and files over kMaxManifestBytes are InvalidArgument. NotFound if
// the file is missing; every other error is InvalidArgument whose message starts with the
// manifest's path and names the field by its dotted path, e.g.
// "/m/tiny/pipeline.yaml: field 'components.unet.file' is required".
StatusOr<PipelineManifest> LoadManifest(const std::string& pipeline_dir, const KindCatalog& kinds);

// Same as LoadManifest, from text; errors still name pipeline_dir/pipeline.yaml, and component and
// tokenizer files are still resolved against (and must exist in) pipeline_dir.
StatusOr<PipelineManifest> ParseManifest(const std::string& yaml_text,
                                         const std::string& pipeline_dir, const KindCatalog& kinds);

}  // namespace qpool
