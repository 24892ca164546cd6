"""How much cuDNN's choice of convolution kernel costs the UNets and VAE decoders.

Records every convolution an SD 1.5- or SDXL-shaped UNet (one denoising call at --batch images
with CFG) and VAE decoder (one decode) run, with random weights in fp16, channels-last as the
server runs them (the SDXL decoder in float32, force_upcast), then times each distinct shape as
ATen runs it under three ways of choosing the kernel, each in a process of its own:
`instant` (ATen's default: cuDNN's instant heuristics, first config that builds), `mode_b`
(TORCH_CUDNN_USE_HEURISTIC_MODE_B=1: cuDNN's slower, more accurate heuristics) and `benchmark`
(torch.backends.cudnn.benchmark: every candidate timed on the first call). Prints and writes
one JSON document: per shape, calls per image and microseconds per mode; per model, the
request's convolution time (calls x time, the UNet's over --steps) under each mode.

  python3 bench/conv_choice.py --models sd15,sdxl --batch 4 --out conv_choice.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_models import SD15_UNET, SD15_VAE, SDXL_UNET, SDXL_VAE  # noqa: E402

MODES = ("instant", "mode_b", "benchmark")
CONFIGS = {"sd15": (SD15_UNET, SD15_VAE, 512, 768, None),
           "sdxl": (SDXL_UNET, SDXL_VAE, 1024, 2048, 2816)}


def record(model: str, batch: int) -> list[dict]:
    """The convolutions of one UNet call (2 x batch rows, CFG) and one VAE decode (batch rows):
    one entry per distinct shape, with its calls per request."""
    from diffusers import AutoencoderKL, UNet2DConditionModel

    unet_cfg, vae_cfg, size, ctx, added = CONFIGS[model]
    seen: dict[tuple, dict] = {}

    def hook(part):
        def on_forward(mod, args, _out):
            x = args[0]
            key = (part, tuple(x.shape), tuple(mod.weight.shape), mod.stride, mod.padding,
                   str(x.dtype).replace("torch.", ""))
            entry = seen.setdefault(key, {"part": part, "x": list(x.shape),
                                          "w": list(mod.weight.shape), "stride": list(mod.stride),
                                          "padding": list(mod.padding), "dtype": key[5],
                                          "calls": 0})
            entry["calls"] += 1
        return on_forward

    lat = size // 8
    with torch.device("cuda"), torch.no_grad():
        unet = UNet2DConditionModel(**unet_cfg).half().to(memory_format=torch.channels_last)
        for m in unet.modules():
            if isinstance(m, torch.nn.Conv2d):
                m.register_forward_hook(hook("unet"))
        rows = 2 * batch
        kwargs = {}
        if added:
            kwargs["added_cond_kwargs"] = {"text_embeds": torch.randn(rows, 1280).half(),
                                           "time_ids": torch.randn(rows, 6).half()}
        unet(torch.randn(rows, 4, lat, lat).half().to(memory_format=torch.channels_last),
             torch.tensor(500), torch.randn(rows, 77, ctx).half(), **kwargs)
        del unet
        vae_dtype = torch.float32 if vae_cfg.get("force_upcast") else torch.float16
        vae = AutoencoderKL(**vae_cfg).to(vae_dtype).to(memory_format=torch.channels_last)
        for m in vae.decoder.modules():
            if isinstance(m, torch.nn.Conv2d):
                m.register_forward_hook(hook("vae"))
        vae.decode(torch.randn(batch, 4, lat, lat, dtype=vae_dtype)
                   .to(memory_format=torch.channels_last))
    return list(seen.values())


def time_shapes(shapes: list[dict], mode: str, iters: int) -> list[float]:
    """Microseconds per call of each shape, as ATen runs it in this process's mode."""
    torch.backends.cudnn.benchmark = mode == "benchmark"
    out = []
    with torch.device("cuda"), torch.no_grad():
        for s in shapes:
            dtype = getattr(torch, s["dtype"])
            x = torch.randn(s["x"], dtype=dtype).to(memory_format=torch.channels_last)
            w = torch.randn(s["w"], dtype=dtype).to(memory_format=torch.channels_last) * 0.05
            run = lambda: torch.nn.functional.conv2d(x, w, None, s["stride"], s["padding"])  # noqa
            for _ in range(3):
                run()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(iters):
                run()
            stop.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(stop) * 1000 / iters)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="sd15,sdxl")
    p.add_argument("--batch", type=int, default=4, help="images per request")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", help="the JSON to write (required)")
    p.add_argument("--time", metavar="SHAPES_JSON", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.time:  # a child: time the shapes in one mode, print the list
        with open(a.time) as f:
            print(json.dumps(time_shapes(json.load(f), a.mode, a.iters)))
        return
    if not a.out:
        p.error("--out is required")

    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "batch": a.batch, "steps": a.steps,
           "models": {}}
    for model in a.models.split(","):
        shapes = record(model, a.batch)
        torch.cuda.empty_cache()
        path = a.out + f".{model}.shapes.json"
        with open(path, "w") as f:
            json.dump(shapes, f)
        for mode in MODES:
            env = dict(os.environ)
            env.pop("TORCH_CUDNN_USE_HEURISTIC_MODE_B", None)
            if mode == "mode_b":
                env["TORCH_CUDNN_USE_HEURISTIC_MODE_B"] = "1"
            res = subprocess.run([sys.executable, __file__, "--time", path, "--mode", mode,
                                  "--iters", str(a.iters)], env=env, check=True,
                                 capture_output=True, text=True)
            for s, us in zip(shapes, json.loads(res.stdout.strip().splitlines()[-1])):
                s[mode + "_us"] = round(us, 2)
        os.remove(path)
        totals = {}
        for mode in MODES:
            for part in ("unet", "vae"):
                reps = a.steps if part == "unet" else 1
                totals[f"{part}_{mode}_ms"] = round(
                    sum(s["calls"] * s[mode + "_us"] for s in shapes if s["part"] == part)
                    * reps / 1000, 2)
        doc["models"][model] = {"totals": totals, "shapes": shapes}
        print(model, json.dumps(totals), flush=True)
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
