"""Imported diffusers pipelines against diffusers itself, side by side on one GPU.

Builds a diffusers Stable Diffusion 1.5-shaped pipeline from its published configs with random
weights (no hub; the tokenizer files come from --tokenizer), saves it with save_pretrained,
imports it with `qpool_export from-diffusers` (fp16, and the variants --quantize asks for),
serves the imports with qpool-server and times Generate through the qpool CLI, then times the
same diffusers pipeline (fp16, eager, and with its UNet under torch.compile when --compile) in the
same run: same size, steps, scheduler (DDIM) and guidance. Prints and writes one JSON document.
--graphs-off adds a twin of every pipeline with execution.cuda_graphs off ("<name>-eager"); the
pipelines take turns request by request, so drift on a shared host hits them alike.

  python3 bench/import_bench.py --server build/server/qpool-server --client build/client/qpool \\
      --tokenizer build/test-models/tiny/tokenizer --work /tmp/import-bench --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SD15_UNET = dict(
    sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
    block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                      "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                    "CrossAttnUpBlock2D"),
    cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32)
SD15_VAE = dict(
    in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, norm_num_groups=32,
    block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4, sample_size=512, scaling_factor=0.18215)
SD15_TEXT = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                 num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu")


def build(src: str, tokenizer_dir: str) -> None:
    from diffusers import (AutoencoderKL, PNDMScheduler, StableDiffusionPipeline,
                           UNet2DConditionModel)
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(0)
    tokenizer = CLIPTokenizer(os.path.join(tokenizer_dir, "vocab.json"),
                              os.path.join(tokenizer_dir, "merges.txt"), model_max_length=77)
    text = CLIPTextModel(CLIPTextConfig(**SD15_TEXT, bos_token_id=tokenizer.bos_token_id,
                                        eos_token_id=tokenizer.eos_token_id,
                                        pad_token_id=tokenizer.pad_token_id))
    pipe = StableDiffusionPipeline(
        vae=AutoencoderKL(**SD15_VAE), text_encoder=text, tokenizer=tokenizer,
        unet=UNet2DConditionModel(**SD15_UNET),
        scheduler=PNDMScheduler(beta_start=0.00085, beta_end=0.012,
                                beta_schedule="scaled_linear", skip_prk_steps=True,
                                steps_offset=1, set_alpha_to_one=False),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.to(torch.float16).save_pretrained(src)


def run_import(src: str, out: str, *args: str) -> float:
    start = time.monotonic()
    path = [os.path.join(ROOT, "tools", "qpool_export"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    subprocess.run([sys.executable, "-m", "qpool_export", "from-diffusers", src, "--out", out,
                    *args], check=True, env=env)
    return time.monotonic() - start


def add_variant(repo: str, base: str, name: str, edit) -> str:
    """A pipeline folder `name` beside `base` sharing its files (hard links) with the manifest
    changed by edit(manifest dict)."""
    import shutil

    import yaml

    src, dst = os.path.join(repo, base), os.path.join(repo, name)
    shutil.copytree(src, dst, copy_function=os.link)
    path = os.path.join(dst, "pipeline.yaml")
    with open(path) as f:
        manifest = yaml.safe_load(f)
    edit(manifest)
    os.remove(path)  # a hard link to the base's manifest
    with open(path, "w") as f:
        yaml.safe_dump(manifest, f, sort_keys=False)
    return name


def summary(seconds):
    seconds = sorted(seconds)
    return {"n": len(seconds), "median_s": statistics.median(seconds),
            "p90_s": seconds[int(0.9 * (len(seconds) - 1))], "min_s": seconds[0],
            "max_s": seconds[-1]}


def time_qpool(server_bin: str, client_bin: str, repo: str, names, a) -> dict:
    port = 50600
    log_path = os.path.join(a.work, "qpool-server.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([server_bin, "--model-repository", repo, "--listen",
                             f"127.0.0.1:{port}", "--load", "all"], stdout=subprocess.PIPE,
                            stderr=log, text=True)
    try:
        for line in proc.stdout:
            if "listening on" in line:
                break
        def generate(name, i):
            done = subprocess.run(
                [client_bin, "--server", f"127.0.0.1:{port}", "--json", "generate",
                 "--pipeline", name, "--prompt", "a red fox in the snow", "--steps",
                 str(a.steps), "--width", str(a.size), "--height", str(a.size), "--seed",
                 str(i), "--scheduler", "ddim", "--guidance", "7.5", "--out",
                 os.path.join(a.work, "qpool-{seed}-{i}.png")],
                capture_output=True, text=True)
            if done.returncode != 0:
                with open(log_path) as f:
                    server_log = f.read()[-3000:]
                sys.exit(f"qpool generate --pipeline {name} failed: {done.stderr.strip()}\n"
                         f"server log:\n{server_log}")
            return json.loads(done.stdout)["timings"]

        times = {name: [] for name in names}
        denoise = {name: [] for name in names}
        for name in names:
            for i in range(a.warmup):
                generate(name, i)
        # Request by request in turn: drift on a shared host hits every pipeline alike.
        for i in range(a.warmup, a.warmup + a.runs):
            for name in names:
                timings = generate(name, i)
                times[name].append(timings["total_seconds"])
                denoise[name].append(timings["denoise_seconds"])
        memory = subprocess.run([client_bin, "--server", f"127.0.0.1:{port}", "--json",
                                 "memory"], check=True, capture_output=True, text=True)
        results = {}
        for name in names:
            results[name] = {"latency": summary(times[name]), "denoise": summary(denoise[name])}
            for p in json.loads(memory.stdout).get("pipelines", []):
                if p.get("name") == name:
                    results[name]["pipeline"] = p
        return results
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def time_diffusers(src: str, a, compile_unet: bool) -> dict:
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(src, torch_dtype=torch.float16,
                                                   safety_checker=None).to("cuda")
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    if compile_unet:
        pipe.unet = torch.compile(pipe.unet, mode="reduce-overhead")
    times = []
    torch.cuda.reset_peak_memory_stats()
    for i in range(a.warmup + a.runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        pipe("a red fox in the snow", height=a.size, width=a.size, num_inference_steps=a.steps,
             guidance_scale=7.5, generator=torch.Generator("cuda").manual_seed(i))
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - start)
    out = {"latency": summary(times),
           "peak_allocated_bytes": torch.cuda.max_memory_allocated()}
    del pipe
    torch.cuda.empty_cache()
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--server", required=True)
    p.add_argument("--client", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--quantize", default="nf4", help="comma list of int8, nf4 variants to import")
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--graphs-off", action="store_true",
                   help="add a twin of every pipeline with execution.cuda_graphs off")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    src = os.path.join(a.work, "sd15-diffusers")
    repo = os.path.join(a.work, "repo")
    start = time.monotonic()
    build(src, a.tokenizer)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "size": a.size, "steps": a.steps, "scheduler": "ddim", "guidance": 7.5,
              "build_seconds": time.monotonic() - start, "import_seconds": {}}
    import diffusers
    import transformers

    result["diffusers"], result["transformers"] = diffusers.__version__, transformers.__version__
    names = ["sd15"]
    result["import_seconds"]["sd15"] = run_import(src, os.path.join(repo, "sd15"), "--dtype",
                                                  "float16", "-q")
    for fmt in (f for f in a.quantize.split(",") if f):
        name = f"sd15-{fmt}"
        result["import_seconds"][name] = run_import(
            src, os.path.join(repo, name), "--dtype", "float16", "-q", "--quantize",
            f"unet={fmt},text_encoder={fmt}")
        names.append(name)
    if a.graphs_off:
        def eager(m):
            m["execution"] = {"cuda_graphs": False}
        names += [add_variant(repo, name, f"{name}-eager", eager) for name in list(names)]
    print(json.dumps(result), flush=True)
    result["qpool"] = time_qpool(a.server, a.client, repo, names, a)
    print(json.dumps(result["qpool"]), flush=True)
    result["diffusers_eager"] = time_diffusers(src, a, compile_unet=False)
    if a.compile:
        result["diffusers_compiled"] = time_diffusers(src, a, compile_unet=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
