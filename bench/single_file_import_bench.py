"""The single-file importer's host memory and time on full-size checkpoints: files with random
weights in the layouts users download (tests/integration/single_file_writer.py, at the shapes of
the families' reference configs, qpool_export.single_file_configs): an SDXL checkpoint in float16
(AUTOMATIC1111's layout), and FLUX.1-dev as ComfyUI users keep it, a Black Forest Labs
transformer in bfloat16 or float8_e4m3fn beside CLIP-L and T5-XXL in float16 and the VAE in
float32. Each is imported by `qpool_export from-single-file` in a process of its own that reports
its peak resident memory (import_memory_bench.PEAK_RSS); outputs go to --out-root (a tmpfs where
the disk holds only the sources) and are removed after each import but the served one.

  python3 bench/single_file_import_bench.py --work /tmp/sfb --out-root /dev/shm/sfb \\
      --cases "sdxl;flux-bf16;flux-fp8:transformer=nf4,text_encoder_2=nf4" \
      --serve SERVER CLIENT --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import types

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "tools", "qpool_export"))

import import_memory_bench as imb  # noqa: E402
import single_file_writer as layout  # noqa: E402
from qpool_export import single_file_configs as configs  # noqa: E402
from qpool_export import weights_file  # noqa: E402
from qpool_export.stream_import import params_on_meta  # noqa: E402


def meta_models(family: str) -> types.SimpleNamespace:
    """The family's reference components, built on meta (sizes only)."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel, UNet2DConditionModel
    from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection,
                              T5Config, T5EncoderModel)

    found = configs.family(family)
    parts = {}
    with params_on_meta():
        for part, cfg in found.items():
            if part in ("model_index", "scheduler"):
                continue
            if part == "unet":
                parts[part] = UNet2DConditionModel.from_config(cfg)
            elif part == "vae":
                parts[part] = AutoencoderKL.from_config(cfg)
            elif part == "transformer":
                parts[part] = FluxTransformer2DModel.from_config(cfg)
            elif cfg.get("model_type") == "t5":
                parts[part] = T5EncoderModel(T5Config.from_dict(cfg))
            else:
                cls = CLIPTextModelWithProjection if part == "text_encoder_2" else CLIPTextModel
                parts[part] = cls(CLIPTextConfig.from_dict(cfg))
    return types.SimpleNamespace(**parts)


def write_random(path: str, tensors, dtype_of, device: str) -> int:
    """A safetensors file of `tensors`' names and sizes ({name: tensor}, meta or not), random
    values of scale 0.02 in dtype_of(name, tensor), written one tensor at a time."""
    plan = [(name, dtype_of(name, t), tuple(t.shape)) for name, t in tensors.items()]
    gen = torch.Generator(device=device).manual_seed(0)
    with weights_file.WeightsWriter(path, plan) as out:
        for name, dtype, shape in plan:
            if dtype.is_floating_point:
                value = torch.randn(shape, generator=gen, device=device) * 0.02
                if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", ".scale",
                                  "ln_1.weight", "ln_2.weight", "ln_final.weight")):
                    value += 1.0
            else:
                value = torch.arange(int(torch.tensor(shape).prod()), device=device) \
                    .reshape(shape) % 77
            out.write(name, value.to(dtype).cpu())
    return os.path.getsize(path)


def build_sources(a, family: str, fp8: bool) -> dict:
    """{flag: path} of the files a case reads, written once per --work."""
    os.makedirs(a.work, exist_ok=True)
    models = meta_models(family)
    if family == "sdxl":
        path = os.path.join(a.work, "sdxl-base.safetensors")
        if not os.path.exists(path):
            write_random(path, layout.sd_checkpoint(models, "sdxl"),
                         lambda n, t: torch.float16 if t.is_floating_point() else t.dtype,
                         a.device)
        return {"checkpoint": path}
    name = "flux1-dev-fp8.safetensors" if fp8 else "flux1-dev.safetensors"
    files = {"checkpoint": os.path.join(a.work, name),
             "--clip-l": os.path.join(a.work, "clip_l.safetensors"),
             "--t5": os.path.join(a.work, "t5xxl_fp16.safetensors"),
             "--vae": os.path.join(a.work, "ae.safetensors")}
    half = lambda n, t: torch.float16 if t.is_floating_point() else t.dtype  # noqa: E731
    make = {
        "checkpoint": (lambda: layout.bfl_flux(models.transformer),
                       (lambda n, t: torch.float8_e4m3fn if t.dim() == 2 else torch.bfloat16)
                       if fp8 else (lambda n, t: torch.bfloat16)),
        "--clip-l": (lambda: layout.hf_clip(models.text_encoder, ""), half),
        "--t5": (lambda: {k: v for k, v in models.text_encoder_2.state_dict().items()
                          if k != "encoder.embed_tokens.weight"}, half),
        "--vae": (lambda: layout.ldm_vae(models.vae, ""),
                  lambda n, t: torch.float32 if t.is_floating_point() else t.dtype),
    }
    for flag, path in files.items():
        if not os.path.exists(path):
            tensors, dtype_of = make[flag]
            write_random(path, tensors(), dtype_of, a.device)
    return files


def tokenizers(a) -> str:
    """tokenizer/ (CLIP) and tokenizer_2/ (CLIP for SDXL, T5 for FLUX) trained on the exporter's
    prompt corpus."""
    from qpool_export import bpe, corpus

    root = os.path.join(a.work, "tokenizers")
    if os.path.isdir(root):
        return root
    clip = os.path.join(root, "tokenizer")
    os.makedirs(clip)
    bpe.write_tokenizer(clip, bpe.train_bpe(corpus.PROMPTS, 1000))
    shutil.copytree(clip, os.path.join(root, "sdxl", "tokenizer_2"))
    os.makedirs(os.path.join(root, "flux", "tokenizer_2"))
    shutil.copyfile(imb.train_spiece(a.work), os.path.join(root, "flux", "tokenizer_2",
                                                             "spiece.model"))
    return root


def run_case(a, case: str) -> dict:
    source, _, quantize = case.partition(":")
    family = "sdxl" if source == "sdxl" else "flux-dev"
    start = time.monotonic()
    files = build_sources(a, family, source == "flux-fp8")
    built = time.monotonic() - start
    root = tokenizers(a)
    folder = os.path.join(root, "sdxl" if family == "sdxl" else "flux")
    for name in ("tokenizer",):
        if not os.path.exists(os.path.join(folder, name)):
            shutil.copytree(os.path.join(root, name), os.path.join(folder, name))
    out = os.path.join(a.out_root, source + ("-quantized" if quantize else ""))
    shutil.rmtree(out, ignore_errors=True)
    args = ["from-single-file", files["checkpoint"], "--out", out, "--tokenizers", folder,
            "--dtype", "float16" if family == "sdxl" else "bfloat16"]
    args += [x for flag, path in files.items() if flag != "checkpoint" for x in (flag, path)]
    if quantize:
        args += ["--quantize", quantize]
    entry = imb.measured(args, out, a.timeout)
    entry.update({"case": case, "source_build_seconds": round(built, 1),
                  "source_bytes": sum(os.path.getsize(p) for p in files.values())})
    return entry


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, help="where the source files are written")
    p.add_argument("--out-root", required=True, help="where the imports are written")
    p.add_argument("--cases", default="sdxl;flux-bf16",
                   help="separated by ';': sdxl, flux-bf16, flux-fp8, each with :QUANTIZE "
                        "(from-single-file's --quantize)")
    p.add_argument("--build-only", action="store_true", help="write the cases' sources only")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--serve", nargs=2, metavar=("SERVER", "CLIENT"), default=None,
                   help="load each case named in --serve-cases and make one image")
    p.add_argument("--serve-cases", default="sdxl", help="separated by ';'")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--drop-sources", action="store_true",
                   help="delete a FLUX transformer file once its cases are done (disk)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    os.makedirs(a.out_root, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "cpus": os.cpu_count(), "imports": []}
    cases = [c for c in a.cases.split(";") if c]
    if a.build_only:
        for case in cases:
            source = case.partition(":")[0]
            build_sources(a, "sdxl" if source == "sdxl" else "flux-dev", source == "flux-fp8")
        return 0
    for i, case in enumerate(cases):
        entry = run_case(a, case)
        folder = entry.get("folder")
        if entry["returncode"] == 0 and a.serve and case in a.serve_cases.split(";"):
            serve = argparse.Namespace(serve=a.serve, steps=a.steps, work=a.work)
            entry["served"] = imb.serve(serve, folder)
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        result["imports"].append(entry)
        print(json.dumps(entry), flush=True)
        source = case.partition(":")[0]
        if a.drop_sources and source.startswith("flux") and \
                all(not c.startswith(source) for c in cases[i + 1:]):
            name = "flux1-dev-fp8.safetensors" if source == "flux-fp8" else \
                "flux1-dev.safetensors"
            os.remove(os.path.join(a.work, name))
        if a.out:
            with open(a.out, "w", encoding="utf-8") as f:
                f.write(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if all(e["returncode"] == 0 for e in result["imports"]) else 1


if __name__ == "__main__":
    sys.exit(main())
