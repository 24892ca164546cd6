"""HiDream-I1-Dev-shaped pipelines at full size with random weights: qpool (bf16, and with its
transformer, T5 and Llama in NF4, quantized by the server at load) against diffusers'
HiDreamImagePipeline (bf16, eager and with its transformer under torch.compile) on one GPU, and
the field report's case: prompt encoding alone under diffusers' model CPU offload against
qpool's Encode-only request under `model`.

The source is a diffusers folder written here from the published configs (17.1B transformer,
Llama-3.1-8B, T5-XXL, CLIP-L, CLIP-G, the 16-channel VAE, Dev's scheduler), its weights drawn
in bfloat16 on the GPU and stored as float8 e4m3: 31 GB instead of 61, so that the source on
the disk and qpool's bfloat16 import in /dev/shm fit one 64 GB-disk host. diffusers and the
importer both read it as bfloat16: the same values. The tokenizers are trained here (small
vocabularies; every encoder still gets its 128 tokens).

  python3 bench/hidream_bench.py --phase source --work /tmp/hd
  python3 bench/hidream_bench.py --phase peers --work /tmp/hd --out peers.json
  python3 bench/hidream_bench.py --phase compiled --work /tmp/hd --out compiled.json
  python3 bench/hidream_bench.py --phase import --work /tmp/hd --repo /dev/shm/hd \\
      --variants hidream-bf16
  python3 bench/hidream_bench.py --phase serve --work /tmp/hd --repo /dev/shm/hd \\
      --variants hidream-bf16 --server S --client C --out serve.json
  (then the same two for hidream-nf4, after removing /dev/shm/hd)

--tiny runs the same plumbing at toy widths on the CPU (a smoke test of this script).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tools", "qpool_export"))
sys.path.insert(0, os.path.join(ROOT, "tests", "testing"))
import import_bench  # noqa: E402
from bench_models import CLIP_BIGG, CLIP_L  # noqa: E402
from flux_bench import FLUX_VAE, T5_XXL, save  # noqa: E402
from generate_bench import summary  # noqa: E402

# HiDream-ai/HiDream-I1-Dev's published configs (its Llama: Llama-3.1-8B-Instruct's).
TRANSFORMER = dict(patch_size=2, in_channels=16, out_channels=16, num_layers=16,
                   num_single_layers=32, attention_head_dim=128, num_attention_heads=20,
                   caption_channels=[4096, 4096], text_emb_dim=2048, num_routed_experts=4,
                   num_activated_experts=2, axes_dims_rope=[64, 32, 32],
                   max_resolution=[128, 128], llama_layers=list(range(32)) + [31] * 16)
LLAMA = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
             num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
             rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
SCHEDULER = dict(shift=6.0, use_dynamic_shifting=False)  # Dev's
STEPS, GUIDANCE = 28, 0.0  # Dev's published settings
PROMPT = "a red fox in the snow, photographed at dawn"
TINY = {"transformer": dict(num_layers=1, num_single_layers=2, attention_head_dim=16,
                            num_attention_heads=2, caption_channels=[32, 32], text_emb_dim=64,
                            axes_dims_rope=[8, 4, 4], max_resolution=[16, 16],
                            llama_layers=[0, 1, 1]),
        "llama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2),
        "t5": dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4),
        "clip_l": dict(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                       num_hidden_layers=2),
        "clip_g": dict(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                       num_hidden_layers=2),
        "vae": dict(block_out_channels=(8, 8, 16, 16), norm_num_groups=4, layers_per_block=1)}
INDEX = {"scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
         "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
         "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
         "text_encoder_3": ["transformers", "T5EncoderModel"],
         "text_encoder_4": ["transformers", "LlamaForCausalLM"],
         "tokenizer": ["transformers", "CLIPTokenizer"],
         "tokenizer_2": ["transformers", "CLIPTokenizer"],
         "tokenizer_3": ["transformers", "T5TokenizerFast"],
         "tokenizer_4": ["transformers", "PreTrainedTokenizerFast"],
         "transformer": ["diffusers", "HiDreamImageTransformer2DModel"],
         "vae": ["diffusers", "AutoencoderKL"]}


def write_tokenizers(src: str) -> dict:
    """CLIP's BPE (both CLIPs), T5's SentencePiece and the Llama's tokenizer.json, trained here
    on the exporter's prompt corpus, saved into src/tokenizer*/ as transformers saves them."""
    import bpe_reference
    import tokenizer_sources
    from transformers import CLIPTokenizer, PreTrainedTokenizerFast, T5TokenizerFast

    work = os.path.join(src, "..", "tokenizer-sources")
    os.makedirs(work, exist_ok=True)
    tokenizer_sources.write_clip_and_t5(work)
    bpe_reference.train(bpe_reference.LLAMA3, True, True).save(
        os.path.join(work, "tokenizer.json"))
    tokenizers = {"tokenizer": CLIPTokenizer(os.path.join(work, "vocab.json"),
                                             os.path.join(work, "merges.txt"),
                                             model_max_length=77),
                  "tokenizer_2": CLIPTokenizer(os.path.join(work, "vocab.json"),
                                               os.path.join(work, "merges.txt"),
                                               model_max_length=77, pad_token="!")}
    t5_dir = os.path.join(work, "t5")
    os.makedirs(t5_dir, exist_ok=True)
    shutil.copyfile(os.path.join(work, "spiece.model"), os.path.join(t5_dir, "spiece.model"))
    tokenizers["tokenizer_3"] = T5TokenizerFast.from_pretrained(t5_dir, model_max_length=128)
    tokenizers["tokenizer_4"] = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(work, "tokenizer.json"), bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>", model_max_length=131072)
    for name, tokenizer in tokenizers.items():
        tokenizer.save_pretrained(os.path.join(src, name))
    shutil.copyfile(os.path.join(work, "spiece.model"),
                    os.path.join(src, "tokenizer_3", "spiece.model"))
    return tokenizers


def write_weights(module, folder: str, file: str, dtype: torch.dtype) -> int:
    """module's floating-point tensors in `dtype` into folder/file (safetensors); returns bytes."""
    from safetensors.torch import save_file

    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous().cpu()
             for k, v in module.state_dict().items()}
    path = os.path.join(folder, file)
    save_file(state, path)
    del state
    return os.path.getsize(path)


def build_source(a) -> dict:
    """The HiDream-I1-Dev folder in a.work/src, one component at a time (each drawn in bfloat16
    on a.device, written, freed)."""
    import diffusers
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler
    from diffusers import HiDreamImageTransformer2DModel
    from transformers import (CLIPTextConfig, CLIPTextModelWithProjection, LlamaConfig,
                              LlamaForCausalLM, T5Config, T5EncoderModel)

    src = os.path.join(a.work, "src")
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    tokenizers = write_tokenizers(src)
    tiny = TINY if a.tiny else {k: {} for k in TINY}
    stored = getattr(torch, a.source_dtype)
    clip_vocab = len(tokenizers["tokenizer"])

    def clip(base, extra, tokenizer):
        # HiDream-I1's CLIPs take 248 positions and project to their own width (768 + 1280).
        cfg = dict(base, **extra, vocab_size=clip_vocab, max_position_embeddings=248)
        cfg["projection_dim"] = cfg["hidden_size"]
        return CLIPTextModelWithProjection(CLIPTextConfig(
            **cfg,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id))

    makers = {
        "text_encoder": lambda: clip(CLIP_L, tiny["clip_l"], tokenizers["tokenizer"]),
        "text_encoder_2": lambda: clip(CLIP_BIGG, tiny["clip_g"], tokenizers["tokenizer_2"]),
        "text_encoder_3": lambda: T5EncoderModel(T5Config(**dict(T5_XXL, **tiny["t5"]))),
        "text_encoder_4": lambda: LlamaForCausalLM(LlamaConfig(**dict(
            LLAMA, **tiny["llama"], bos_token_id=tokenizers["tokenizer_4"].bos_token_id,
            eos_token_id=tokenizers["tokenizer_4"].eos_token_id))),
        "transformer": lambda: HiDreamImageTransformer2DModel(**dict(
            TRANSFORMER, **tiny["transformer"], **blocks(a))),
        "vae": lambda: AutoencoderKL(**dict(FLUX_VAE, **tiny["vae"])),
    }
    sizes = {}
    before = torch.get_default_dtype()
    torch.manual_seed(0)
    for name, make in makers.items():
        start = time.monotonic()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(a.device), torch.no_grad():
                module = make()
        finally:
            torch.set_default_dtype(before)
        folder = os.path.join(src, name)
        os.makedirs(folder)
        if name.startswith("text_encoder"):
            module.config.save_pretrained(folder)
            file = "model.safetensors"
        else:
            module.save_config(folder)
            file = "diffusion_pytorch_model.safetensors"
        sizes[name] = {"bytes": write_weights(module, folder, file, stored),
                       "params": sum(p.numel() for p in module.parameters()),
                       "seconds": time.monotonic() - start}
        print(name, json.dumps(sizes[name]), flush=True)
        del module
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    FlowMatchEulerDiscreteScheduler(**SCHEDULER).save_config(os.path.join(src, "scheduler"))
    with open(os.path.join(src, "model_index.json"), "w") as f:
        json.dump({"_class_name": "HiDreamImagePipeline",
                   "_diffusers_version": diffusers.__version__, **INDEX}, f, indent=1)
    return sizes


def blocks(a) -> dict:
    """--blocks D,S: the transformer's first D double- and S single-stream blocks of the
    published config (each keeping its Llama layer), for quicker runs; {} for all of them."""
    if not a.blocks:
        return {}
    double, single = (int(n) for n in a.blocks.split(","))
    layers = TRANSFORMER["llama_layers"]
    n = TRANSFORMER["num_layers"]
    return {"num_layers": double, "num_single_layers": single,
            "llama_layers": layers[:double] + layers[n:n + single]}


def load_diffusers(a):
    from diffusers import HiDreamImagePipeline

    pipe = HiDreamImagePipeline.from_pretrained(os.path.join(a.work, "src"),
                                                torch_dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def offload_encode(pipe, a) -> dict:
    """The field report's case: encode_prompt alone under enable_model_cpu_offload, then what
    the GPU still holds (the last encoder that ran stays until another model runs)."""
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    pipe.enable_model_cpu_offload()
    with torch.no_grad():
        pipe.encode_prompt(prompt=PROMPT, prompt_2=None, prompt_3=None, prompt_4=None,
                           do_classifier_free_guidance=False, max_sequence_length=128)
    torch.cuda.synchronize()
    left = torch.cuda.memory_allocated() - base
    on_gpu = {name: str(next(module.parameters()).device)
              for name, module in pipe.components.items()
              if isinstance(module, torch.nn.Module)}
    pipe.remove_all_hooks()
    return {"allocated_after_encode_bytes": left, "component_devices": on_gpu}


def time_pipe(pipe, a) -> dict:
    times = []
    torch.cuda.reset_peak_memory_stats()
    for i in range(a.warmup + a.runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            pipe(prompt=PROMPT, height=a.size, width=a.size, num_inference_steps=a.steps,
                 guidance_scale=a.guidance, generator=torch.Generator("cuda").manual_seed(i),
                 output_type="np")
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - start)
        print(f"  image {i}: {time.perf_counter() - start:.2f} s", flush=True)
    return {"latency": summary(times), "peak_allocated_bytes": torch.cuda.max_memory_allocated()}


def peers(a, result: dict) -> None:
    """diffusers on the source, each figure saved as it is measured. Phase peers: the offload
    case first (the pipeline starts on the host), then eager; phase compiled: the transformer
    under torch.compile(mode=a.compile), its warm-up compiling."""
    pipe = load_diffusers(a)
    if a.phase == "peers":
        result["diffusers_model_offload_encode"] = offload_encode(pipe, a)
        print(json.dumps(result["diffusers_model_offload_encode"]), flush=True)
        save(result, a.out)
        pipe.to("cuda")
        result["diffusers_bf16"] = time_pipe(pipe, a)
        print("eager", json.dumps(result["diffusers_bf16"]), flush=True)
        return
    pipe.to("cuda")
    # Not fullgraph: moe_infer reads the experts' token counts on the host.
    pipe.transformer = torch.compile(pipe.transformer, mode=a.compile)
    result[f"diffusers_bf16_compile_{a.compile}"] = time_pipe(pipe, a)
    print("compiled", json.dumps(result[f"diffusers_bf16_compile_{a.compile}"]), flush=True)


def import_variants(a) -> dict:
    """qpool-export from-diffusers of each of a.variants into a.repo: hidream-bf16 as it is,
    hidream-nf4 with its transformer, T5 and Llama quantized at load (in both, the routed experts
    grouped, Note [Routed experts]). One variant at a time fits the host's
    memory with the repository in /dev/shm: import, serve and remove each in turn."""
    seconds = {}
    for name in a.variants.split(","):
        out = os.path.join(a.repo, name)
        shutil.rmtree(out, ignore_errors=True)
        quantize = () if name == "hidream-bf16" else (
            "--quant-mode", "load-time",
            "--quantize", "transformer=nf4,text_encoder_3=nf4,text_encoder_4=nf4")
        seconds[name] = import_bench.run_import(os.path.join(a.work, "src"), out, "--dtype",
                                                "bf16", *quantize)
    return {"import_seconds": seconds}


def serve(a, result: dict) -> None:
    """Times each of a.variants; the variants already in a.out (an earlier serve of the others)
    are kept, and hidream-nf4 is compared with hidream-bf16 once both are there."""
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    if a.out and os.path.exists(a.out):
        with open(a.out) as f:
            result.update({k: v for k, v in json.load(f).items() if k.startswith("hidream-")})
    for name in a.variants.split(","):
        result[name] = import_bench.time_qpool(
            a.server, a.client, a.repo, name, a, check_encode=a.encode_check and
            device != "cpu" and name == "hidream-nf4", scheduler="euler", device=device)
        print(name, json.dumps(result[name].get("latency", result[name])), flush=True)
        save(result, a.out)
    base, nf4 = result.get("hidream-bf16", {}), result.get("hidream-nf4", {})
    if "latency" in base and "latency" in nf4:
        nf4["over_hidream_bf16"] = {
            "latency_p50": nf4["latency"]["median_s"] / base["latency"]["median_s"],
            "pipeline_bytes": nf4["pipeline_bytes"] / base["pipeline_bytes"]}
        nf4["fidelity_vs_hidream-bf16"] = import_bench.fidelity(a.work, "hidream-bf16",
                                                                "hidream-nf4")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phase", choices=("source", "peers", "compiled", "import", "serve"),
                   required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--repo", help="import, serve: the model repository (e.g. in /dev/shm)")
    p.add_argument("--out", help="peers, serve: the result JSON")
    p.add_argument("--server")
    p.add_argument("--client")
    p.add_argument("--device", default="cuda", help="source: where the weights are drawn")
    p.add_argument("--source-dtype", default="float8_e4m3fn",
                   help="source: the stored dtype (bfloat16 for an exact source)")
    p.add_argument("--tiny", action="store_true", help="toy widths (a CPU smoke test)")
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--guidance", type=float, default=GUIDANCE)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--compile", default="default",
                   help="compiled: torch.compile mode of the transformer")
    # Encode's reply holds the Llama's 32 layers in float32: 64 MiB a prompt at this size.
    p.add_argument("--server-args", default="--max-message-mb 256")
    p.add_argument("--variants", default="hidream-bf16,hidream-nf4",
                   help="import, serve: the variants (hidream-bf16, hidream-nf4)")
    p.add_argument("--blocks", help="source: D,S double- and single-stream blocks of the "
                                    "transformer (default: the published 16,32)")
    p.add_argument("--profile", action="store_true",
                   help="serve: record one more request after the timed ones with the server's "
                        "profiler, its kernels by kind in the result")
    p.add_argument("--no-encode-check", dest="encode_check", action="store_false",
                   help="serve: no Encode-only check under `model` after hidream-nf4's images")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "size": a.size, "steps": a.steps,
              "guidance": a.guidance, "source_dtype": a.source_dtype,
              **({"blocks": a.blocks} if a.blocks else {})}
    if a.phase == "source":
        print(json.dumps(build_source(a)))
    elif a.phase in ("peers", "compiled"):
        peers(a, result)
    elif a.phase == "import":
        print(json.dumps(import_variants(a)))
    else:
        serve(a, result)
    if a.out:
        save(result, a.out)
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
