"""FLUX.1-dev-shaped pipelines: qpool (bf16, and NF4 quantized by the server at load) against
diffusers' FluxPipeline (bf16, eager) side by side on one GPU, with random weights.

The full-size model does not fit the importer's float32 checks on a host (a 12B transformer is
48 GB in float32, twice over with its mirror), so this builds the diffusers modules from the
published configs directly in bfloat16 on the GPU, times FluxPipeline, and exports qpool's
components from those same modules with qpool_export's FLUX modules (the ones the importer
checks against diffusers in tests/integration/test_import_flux.py): built on the meta device,
materialised in bf16 on the GPU, given the diffusers weights, traced there and saved. The
transformer and T5 keep quantizable layers: one set of files serves the bf16 pipeline and the
NF4 one (`quantization: nf4` in its manifest, quantized by the server at load) and flux-w8a8
(the transformer in w8a8, quantized at load; `--variants flux-bf16,flux-w8a8` times it). Each
pipeline is
then served by its own qpool-server and timed through the qpool CLI; the bf16 one also runs the
Encode-only check under `model` offload (import_bench.encode_check). With `--compile` the export
also writes an AOTInductor package of the transformer (bf16, for the export's device type) and a
third pipeline, flux-bf16-compiled, whose manifest names it; with `--peers` FluxPipeline is also
timed with its transformer under torch.compile in the modes named, after its eager runs.
With `--nf4-prequantized` the export also writes flux-nf4-prequantized: the same pipeline with
its transformer and T5 files holding NF4 weights, for load/unload soaks (bench/memory_soak.py)
whose loads only read and copy them.

  python3 bench/flux_bench.py --phase export --work /tmp/flux --tokenizer TOKDIR --spiece M
  python3 bench/flux_bench.py --phase serve --work /tmp/flux --server S --client C --out R.json
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
import import_bench  # noqa: E402
from bench_models import CLIP_L  # noqa: E402
from import_bench import summary  # noqa: E402

# black-forest-labs/FLUX.1-dev's published configs.
FLUX_DEV_TRANSFORMER = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38,
                            attention_head_dim=128, num_attention_heads=24,
                            joint_attention_dim=4096, pooled_projection_dim=768,
                            guidance_embeds=True, axes_dims_rope=(16, 56, 56))
T5_XXL = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
              relative_attention_num_buckets=32, relative_attention_max_distance=128,
              feed_forward_proj="gated-gelu", dropout_rate=0.0, layer_norm_epsilon=1e-6)
FLUX_VAE = dict(in_channels=3, out_channels=3, latent_channels=16, layers_per_block=2,
                norm_num_groups=32, block_out_channels=(128, 256, 512, 512),
                down_block_types=("DownEncoderBlock2D",) * 4,
                up_block_types=("UpDecoderBlock2D",) * 4, sample_size=1024,
                scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                use_post_quant_conv=False)
FLUX_SCHEDULER = dict(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                      base_image_seq_len=256, max_image_seq_len=4096)
T5_LENGTH = 512
# --tiny: the same architecture at toy widths (a CPU smoke test of this script's plumbing).
TINY = {"transformer": dict(attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                            pooled_projection_dim=32, axes_dims_rope=(4, 6, 6)),
        "t5": dict(vocab_size=512, d_model=32, d_kv=8, d_ff=64, num_heads=4),
        "clip": dict(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                     num_hidden_layers=2),
        "vae": dict(block_out_channels=(8, 8, 16, 16), norm_num_groups=4, layers_per_block=1)}
PROMPT = "a red fox in the snow, photographed at dawn"


def build_diffusers(a):
    """FluxPipeline with random bf16 weights on the GPU (initialised there in bf16)."""
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline,
                           FluxTransformer2DModel)
    from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config,
                              T5EncoderModel, T5TokenizerFast)

    t5_dir = os.path.join(a.work, "t5-tokenizer")
    os.makedirs(t5_dir, exist_ok=True)
    shutil.copyfile(a.spiece, os.path.join(t5_dir, "spiece.model"))
    tokenizer = CLIPTokenizer(os.path.join(a.tokenizer, "vocab.json"),
                              os.path.join(a.tokenizer, "merges.txt"), model_max_length=77)
    tokenizer_2 = T5TokenizerFast.from_pretrained(t5_dir, model_max_length=T5_LENGTH)
    tiny = TINY if a.tiny else {"transformer": {}, "t5": {}, "clip": {}, "vae": {}}
    transformer_cfg = dict(FLUX_DEV_TRANSFORMER, num_layers=a.double, num_single_layers=a.single,
                           **tiny["transformer"])
    clip_cfg = dict(CLIP_L, **tiny["clip"])
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(a.device):
            transformer = FluxTransformer2DModel(**transformer_cfg)
            text_encoder_2 = T5EncoderModel(T5Config(**dict(T5_XXL, num_layers=a.t5_layers,
                                                            **tiny["t5"])))
            text_encoder = CLIPTextModel(CLIPTextConfig(**clip_cfg,
                                                        projection_dim=clip_cfg["hidden_size"]))
            vae = AutoencoderKL(**dict(FLUX_VAE, **tiny["vae"]))
    finally:
        torch.set_default_dtype(before)
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER), vae=vae,
                        text_encoder=text_encoder, tokenizer=tokenizer,
                        text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
                        transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def time_diffusers(pipe, a, compile_mode=None) -> dict:
    """FluxPipeline's latency over a.runs after a.warmup, eager or with its transformer under
    torch.compile(mode=compile_mode) (the warm-ups include compiling)."""
    eager = pipe.transformer
    if compile_mode:
        torch._dynamo.reset()
        pipe.transformer = torch.compile(eager, mode=compile_mode, fullgraph=True)
    try:
        return _time_pipe(pipe, a)
    finally:
        pipe.transformer = eager


def _time_pipe(pipe, a) -> dict:
    times = []
    cuda = a.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(a.warmup + a.runs):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            pipe(prompt=PROMPT, height=a.size, width=a.size, num_inference_steps=a.steps,
                 guidance_scale=a.guidance, max_sequence_length=T5_LENGTH,
                 generator=torch.Generator(a.device).manual_seed(i), output_type="pil")
        if cuda:
            torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - start)
    return {"latency": summary(times),
            "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None}


def _materialise(make, computed, state, device):
    """qpool's module `make()` in bf16 on the GPU with `state` (the diffusers weights), built on
    the meta device; `computed` is a small CPU instance whose computed buffers (float32 `freqs`,
    T5's bucket table) it takes, as the importer's _load_strict does."""
    with torch.device("meta"):
        module = make()
    module = module.to(torch.bfloat16).to_empty(device=device)
    own = dict(computed.named_buffers())
    missing = module.load_state_dict(state, strict=False)
    assert not missing.unexpected_keys, missing.unexpected_keys[:5]
    assert set(missing.missing_keys) <= set(own), sorted(set(missing.missing_keys) - set(own))[:5]
    for name in missing.missing_keys:
        owner, _, leaf = name.rpartition(".")
        setattr(module.get_submodule(owner), leaf, own[name].to(device))
    return module.eval()


def _save(module, inputs, path):
    """`module` traced on `inputs` into `path`, its tensors saved on the host. The trace shares
    the module's tensors, so moving it moves them: they go back to `inputs`' device after, and
    the caller's module is where it was."""
    from qpool_export import tracing

    traced = tracing.trace(module, inputs)
    tracing.check_no_tensor_constants(os.path.basename(path), traced)
    traced = traced.cpu()
    tracing.save(os.path.basename(path), traced, path)
    del traced
    module.to(inputs[0].device)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _plain_linears(module):
    """`module` with every QuantLinear kept in float (load-time quantization) back to an
    nn.Linear on the same tensors (nothing copied): what torch.export compiles as a plain linear,
    with the parameter names the TorchScript file's tensors have."""
    from qpool_export.quant import QuantLinear

    for qualified, child in list(module.named_modules()):
        if isinstance(child, QuantLinear) and child.format == "none":
            linear = torch.nn.Linear(child.in_features, child.out_features,
                                     bias=child.bias is not None, device="meta")
            linear.weight = torch.nn.Parameter(child.weight, requires_grad=False)
            if child.bias is not None:
                linear.bias = torch.nn.Parameter(child.bias, requires_grad=False)
            parent, _, attr = qualified.rpartition(".")
            setattr(module.get_submodule(parent) if parent else module, attr, linear)
    return module


def compile_transformer(transformer, source: str, folder: str, device: str) -> float:
    """The AOTInductor package of `transformer` (saved as `source`) into `folder`, for the
    device type of `device`, in bf16; returns the seconds it took."""
    from qpool_export import compile as aot
    from qpool_export import manifest as manifest_io
    from qpool_export.flux_transformer import image_ids, text_ids

    device_type = "cuda" if device.startswith("cuda") else "cpu"
    cfg = transformer.config
    examples = (torch.randn(2, 4, 64), torch.randn(2, T5_LENGTH, cfg.joint_attention_dim),
                torch.randn(2, cfg.pooled_projection_dim),
                torch.rand(2), image_ids(2, 2), text_ids(T5_LENGTH), torch.full((2,), 3.5))
    return aot.compile_component(_plain_linears(transformer), "transformer", examples,
                                 device_type, os.path.join(folder,
                                                           aot.package_name("transformer",
                                                                            device_type)),
                                 manifest_io.sha256_file(source), torch.bfloat16)


def _quantize_now(module, blocksize: int = 64) -> int:
    """Quantizes to NF4, in place, every QuantLinear of `module` that still holds its float
    weight (the load-time layers), as the server would at load; returns how many."""
    from qpool_export import quant

    count = 0
    for child in module.modules():
        if isinstance(child, quant.QuantLinear) and child.format == "none":
            state = quant.quantize(child.weight, "nf4", blocksize)
            for name in ("weight",) + quant.STATE_NAMES:
                setattr(child, name, state[name])
            count += 1
    return count


def save(result: dict, path: str) -> None:
    """`result` as it stands into `path`: written after every measurement, so that a run cut
    short (a failed export, a lease's end) keeps what it measured."""
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def export(pipe, a) -> dict:
    """qpool's components of `pipe` into work/repo/flux-bf16, and flux-nf4 (links to the same
    files, transformer and T5 quantized to NF4 by the server at load); with a.compile also
    flux-bf16-compiled (the same files and the transformer's package); with a.nf4_prequantized
    also flux-nf4-prequantized (transformer and T5 files of its own, quantized now)."""
    import dataclasses

    from qpool_export import from_diffusers as fd
    from qpool_export import manifest as manifest_io
    from qpool_export import quant, scheduler_import
    from qpool_export.clip_text import ClipTextConfig, ClipTextEncoder
    from qpool_export.flux_transformer import FluxTransformer, FluxTransformerConfig
    from qpool_export.sd_vae import SdVaeConfig, SdVaeDecoder
    from qpool_export.t5_encoder import T5Encoder, T5EncoderConfig

    out = os.path.join(a.work, "repo", "flux-bf16")
    prequantized = os.path.join(a.work, "repo", "flux-nf4-prequantized")
    if a.nf4_prequantized:
        os.makedirs(prequantized, exist_ok=True)
    os.makedirs(os.path.join(out, "tokenizer"), exist_ok=True)
    os.makedirs(os.path.join(out, "tokenizer_2"), exist_ok=True)
    for f in ("vocab.json", "merges.txt"):
        shutil.copyfile(os.path.join(a.tokenizer, f), os.path.join(out, "tokenizer", f))
    shutil.copyfile(a.spiece, os.path.join(out, "tokenizer_2", "spiece.model"))
    timings = {}
    start = time.monotonic()
    with torch.no_grad():
        clip_cfg = ClipTextConfig.from_transformers(pipe.text_encoder.config.to_dict(), "clip")
        clip = ClipTextEncoder(clip_cfg, pooler=True).to(a.device)
        clip.load_state_dict({k[len("text_model."):] if k.startswith("text_model.") else k: v
                              for k, v in pipe.text_encoder.state_dict().items()
                              if not k.endswith("position_ids")})
        _save(clip.to(torch.bfloat16).eval(), (torch.zeros(1, 77, dtype=torch.long,
                                                            device=a.device),),
              os.path.join(out, "text_encoder.pt"))
        del clip

        t5_cfg = T5EncoderConfig.from_transformers(pipe.text_encoder_2.config.to_dict(), "t5")
        small = T5Encoder(dataclasses.replace(t5_cfg, num_layers=1), T5_LENGTH)
        t5 = _materialise(lambda: T5Encoder(t5_cfg, T5_LENGTH), small,
                          pipe.text_encoder_2.state_dict(), a.device)
        quant.quantize_module(t5, "nf4", prequantize=False)
        tokens = (torch.zeros(1, T5_LENGTH, dtype=torch.long, device=a.device),)
        _save(t5, tokens, os.path.join(out, "text_encoder_2.pt"))
        if a.nf4_prequantized:
            _quantize_now(t5)
            _save(t5, tokens, os.path.join(prequantized, "text_encoder_2.pt"))
        del t5, small
        timings["t5_seconds"] = time.monotonic() - start

        cfg = FluxTransformerConfig.from_diffusers(dict(pipe.transformer.config), "transformer")
        small = FluxTransformer(dataclasses.replace(cfg, num_layers=0, num_single_layers=0))
        transformer = _materialise(lambda: FluxTransformer(cfg), small,
                                   pipe.transformer.state_dict(), a.device)
        transformer.fuse_projections()  # as the importer does (Note [Fused projections])
        quant.quantize_module(transformer, "nf4", prequantize=False)
        rows = cols = 4
        ids = torch.zeros(rows, cols, 3)
        ids[..., 1] = torch.arange(rows)[:, None]
        ids[..., 2] = torch.arange(cols)[None, :]
        example = (torch.randn(1, rows * cols, 64), torch.randn(1, 8, cfg.joint_attention_dim),
                   torch.randn(1, cfg.pooled_projection_dim))
        example = tuple(t.to(a.device, torch.bfloat16) for t in example) + tuple(
            t.to(a.device) for t in (torch.rand(1), ids.reshape(-1, 3), torch.zeros(8, 3),
                               torch.full((1,), 3.5)))
        _save(transformer, example, os.path.join(out, "transformer.pt"))
        timings["transformer_seconds"] = time.monotonic() - start
        if a.compile:
            compiled = os.path.join(a.work, "repo", "flux-bf16-compiled")
            os.makedirs(compiled, exist_ok=True)
            timings["compile_seconds"] = compile_transformer(
                transformer, os.path.join(out, "transformer.pt"), compiled, a.device)
        if a.nf4_prequantized:
            _quantize_now(transformer)
            _save(transformer, example, os.path.join(prequantized, "transformer.pt"))
        del transformer, small

        vae_cfg = SdVaeConfig.from_diffusers(dict(pipe.vae.config), "vae")
        vae = SdVaeDecoder(vae_cfg).to(a.device)
        vae.load_state_dict({k: v for k, v in pipe.vae.state_dict().items()
                             if k.startswith("decoder.")})
        _save(vae.to(torch.bfloat16).eval(),
              (torch.randn(1, 16, 8, 8, device=a.device, dtype=torch.bfloat16),),
              os.path.join(out, "vae_decoder.pt"))
        del vae
    scheduler, _ = scheduler_import.translate_flow(
        dict(pipe.scheduler.config, _class_name=type(pipe.scheduler).__name__), "scheduler")
    clip_tok = fd.Tokenizer("tokenizer", 77, "<|endoftext|>")
    variants = {"flux-bf16": {}, "flux-nf4": {
        c: manifest_io.quantization_section("nf4", 64, False)
        for c in ("transformer", "text_encoder_2")},
        # The transformer's linears in w8a8 at load (all of them hold 9 to 38 million weights,
        # where the int8 product pays: docs/quantization.md); T5, run once per request, in bf16.
        "flux-w8a8": {"transformer": manifest_io.quantization_section("w8a8", 64, False)}}
    if a.compile:
        variants["flux-bf16-compiled"] = {}
    if a.nf4_prequantized:
        variants["flux-nf4-prequantized"] = variants["flux-nf4"]
    for name, quant_sections in variants.items():
        folder = os.path.join(a.work, "repo", name)
        if name != "flux-bf16":
            os.makedirs(folder, exist_ok=True)
            for entry in os.listdir(out):
                if entry != "pipeline.yaml" and not os.path.exists(os.path.join(folder, entry)):
                    os.symlink(os.path.join("..", "flux-bf16", entry), os.path.join(folder, entry))
        manifest = fd.build_flux_manifest(scheduler, vae_cfg, clip_tok, T5_LENGTH,
                                          quant_sections, "bfloat16")
        manifest["placement"]["device"] = "cuda:0" if a.device.startswith("cuda") else "cpu"
        if name == "flux-bf16-compiled":
            from qpool_export import compile as aot

            manifest["components"]["transformer"]["compiled"] = aot.manifest_entry(
                folder, "transformer", "cuda" if a.device.startswith("cuda") else "cpu")
        with open(os.path.join(folder, "pipeline.yaml"), "w") as f:
            f.write(manifest_io.dump_manifest(manifest, "flux_bench: random FLUX.1-dev weights"))
    timings["export_seconds"] = time.monotonic() - start
    return timings


def compare_to_bf16(result: dict, timed: list, a) -> None:
    """Each of the `timed` results' p50 latency and pipeline bytes as a multiple of flux-bf16's,
    and its images against flux-bf16's for the same requests (import_bench.fidelity), when
    flux-bf16 ran."""
    base = result.get("flux-bf16", {})
    if "latency" not in base:
        return
    for name in timed:
        mine = result.get(name, {})
        if name == "flux-bf16" or "latency" not in mine:
            continue
        mine["over_flux_bf16"] = {
            "latency_p50": mine["latency"]["median_s"] / base["latency"]["median_s"],
            "pipeline_bytes": mine["pipeline_bytes"] / base["pipeline_bytes"]}
        mine["fidelity_vs_flux-bf16"] = import_bench.fidelity(a.work, "flux-bf16", name)
        print(name, "vs flux-bf16", json.dumps(mine["over_flux_bf16"]),
              json.dumps(mine["fidelity_vs_flux-bf16"]), flush=True)


def residency_check(a, name: str) -> dict:
    """`name` generates an image (512x512, 4 steps), is offloaded to the host, onloaded back and
    generates it again: the PNGs must be byte-identical, and nothing of the pipeline may stay on
    the GPU while it is offloaded."""
    from generate_bench import GrpcClient, start_server, stop_server

    proc, address, _ = start_server(a.server, os.path.join(a.work, "repo"), "cuda:0", 0,
                                    ["--load", name])
    try:
        client = GrpcClient(address)
        pb = client.pb

        def image():
            request = pb.GenerateRequest(pipeline=name, prompt=PROMPT, steps=4, width=512,
                                         height=512, seed=7, guidance_scale=a.guidance)
            for message in client.inference.Generate(request):
                if message.HasField("result"):
                    return message.result.images[0].png
            raise RuntimeError("no result")

        def on_gpu():
            report = client.models.GetMemoryReport(pb.GetMemoryReportRequest(max_events=0))
            pipeline = next(p for p in report.pipelines if p.name == name)
            device = next(d for d in report.devices if d.device == "cuda:0")
            return (sum(c.weight_bytes + c.quant_state_bytes + c.other_bytes + c.graph_bytes
                        for c in pipeline.components if c.device.startswith("cuda")),
                    device.allocated_bytes)

        before = image()
        resident = on_gpu()
        offload = client.models.OffloadPipeline(pb.OffloadPipelineRequest(name=name))
        offloaded = on_gpu()
        onload = client.models.OnloadPipeline(pb.OnloadPipelineRequest(name=name))
        after = image()
        return {"png_bytes_identical": before == after, "png_bytes": len(before),
                "pipeline_bytes_on_gpu_resident": resident[0],
                "pipeline_bytes_on_gpu_offloaded": offloaded[0],
                "allocated_resident": resident[1], "allocated_offloaded": offloaded[1],
                "offload_seconds": offload.seconds, "offload_bytes": offload.bytes,
                "onload_seconds": onload.seconds, "onload_bytes": onload.bytes}
    finally:
        stop_server(proc)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phase", choices=("export", "serve"), required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--tokenizer", help="folder with CLIP's vocab.json and merges.txt (export)")
    p.add_argument("--spiece", help="a SentencePiece model for T5's tokenizer (export)")
    p.add_argument("--server")
    p.add_argument("--client")
    p.add_argument("--out", required=True)
    p.add_argument("--double", type=int, default=19, help="double-stream blocks (19)")
    p.add_argument("--single", type=int, default=38, help="single-stream blocks (38)")
    p.add_argument("--t5-layers", type=int, default=24, help="T5 encoder layers (24)")
    p.add_argument("--device", default="cuda", help="where the export builds (cpu: a smoke test)")
    p.add_argument("--tiny", action="store_true",
                   help="export: toy widths of the same architecture (a CPU smoke test)")
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=28)
    p.add_argument("--guidance", type=float, default=3.5)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--variants", default="flux-bf16,flux-nf4",
                   help="serve: the pipelines to time (flux-bf16-compiled after an export with "
                        "--compile)")
    p.add_argument("--server-args", default="",
                   help="serve: more qpool-server flags, space-separated")
    p.add_argument("--batch", type=int, default=1, help="serve: images per request")
    p.add_argument("--attention", default="auto",
                   help="serve: comma list of qpool-server --attention values; each variant is "
                        "timed with each ('NAME@cudnn' beside NAME for auto)")
    p.add_argument("--compile", action="store_true",
                   help="export: also an AOTInductor package of the transformer "
                        "(flux-bf16-compiled)")
    p.add_argument("--nf4-prequantized", action="store_true",
                   help="export: also flux-nf4-prequantized, whose transformer and T5 files hold "
                        "NF4 weights (quantized at export: a load only reads and copies them)")
    p.add_argument("--peers", default="",
                   help="export: FluxPipeline also with its transformer under torch.compile in "
                        "these modes (comma separated: default, max-autotune, reduce-overhead)")
    p.add_argument("--residency-check", default="",
                   help="serve: also offload and onload this pipeline between two images")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__,
              "size": a.size, "steps": a.steps, "guidance": a.guidance,
              "double_blocks": a.double, "single_blocks": a.single}
    if a.phase == "export":
        import diffusers

        result["diffusers_version"] = diffusers.__version__
        pipe = build_diffusers(a)
        pipe.to(a.device)
        result["diffusers_bf16"] = time_diffusers(pipe, a)
        print(json.dumps(result["diffusers_bf16"]), flush=True)
        save(result, a.out)
        for mode in filter(None, a.peers.split(",")):
            result[f"diffusers_bf16_compile_{mode}"] = time_diffusers(pipe, a, mode)
            print(mode, json.dumps(result[f"diffusers_bf16_compile_{mode}"]), flush=True)
            save(result, a.out)
        result["export"] = export(pipe, a)
    else:
        cuda = a.device.startswith("cuda")
        timed = []
        for name in a.variants.split(","):
            for attention in a.attention.split(","):
                key = import_bench.timed_name(name, attention)
                timed.append(key)
                result[key] = import_bench.time_qpool(
                    a.server, a.client, os.path.join(a.work, "repo"), name, a,
                    check_encode=cuda and key == "flux-bf16", scheduler="euler",
                    device="cuda:0" if cuda else "cpu", attention=attention)
                print(key, json.dumps(result[key].get("latency", result[key])), flush=True)
                save(result, a.out)
        compare_to_bf16(result, timed, a)
        if a.residency_check:
            result["residency_check"] = residency_check(a, a.residency_check)
            print(json.dumps(result["residency_check"]), flush=True)
    save(result, a.out)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
