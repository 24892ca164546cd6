#!/usr/bin/env python3
"""What int8 convolutions cost an image (Note [Int8 convolutions]): the random-weight diffusers
pipeline of bench_models.py generates the same requests with its UNet's convolutions as they are,
then with each convolution's weight and input rounded to int8 as Int8Conv2d takes them, every
other layer unchanged; each variant's decoded images against the unquantized ones (PSNR, largest
difference in 8-bit levels).

Variants:
- `none`: the unquantized pipeline again (the comparison's floor);
- `linears`: the UNet's linear weights rounded to int8 per output row, its convolutions untouched
  (how much the pipeline itself turns small changes into different images);
- `linears_w8a8`: the linears as the w8a8 format computes them (int8 weights per output row, int8
  inputs per token), the convolutions untouched;
- `weights`: the convolutions' per-output-channel int8 weights alone;
- `per_batch`: and their inputs with one scale for the whole batch, guidance's two halves
  included (what Int8Conv2d computes);
- `per_image`: one input scale per image of the batch, for comparison;
- `smooth`: per batch, after SmoothQuant's per-input-channel factors max|x_c|^0.5 / max|w_c|^0.5,
  divided out of the input and into the weight (taken from each call's own input: an upper bound
  for calibrated factors);
- `asymmetric`: per batch, 256 levels between the input's minimum and maximum, zero exact;
- `fp8`: per batch, float8 e4m3 scaled to the input's absmax, and the weight in float8 per output
  channel (an fp8 convolution).
Convolutions whose channel counts are not multiples of 16 (the UNet's first and last) stay as they
are, as in Int8Conv2d. A random-weight UNet can turn small differences into different images over
30 guided steps, so each convolution's own error is measured too: during one unquantized
generation, ||conv_q(x) - conv(x)|| / ||conv(x)|| on the input it was given (the largest over the
generation's calls).

`--sweep VARIANT` then rounds one convolution at a time as VARIANT does and compares the first
image, and finally rounds together every convolution that alone kept `--sweep-db` or more: which
convolutions could take int8 inputs, and what all of them at once cost.

  bench/conv_quant_accuracy.py --model sdxl --tokenizer build/test-models/tiny/tokenizer \\
      --work /tmp/convq --out conv_int8_accuracy.json
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_models import MODELS, build  # noqa: E402

PROMPTS = ["a red fox in the snow", "a lighthouse at dusk, oil painting",
           "a bowl of ramen, studio photo", "an old map of a harbour town"]
VARIANTS = ("none", "linears", "linears_w8a8", "weights", "per_batch", "per_image", "smooth",
            "asymmetric", "fp8")
# The input variants: the dimensions one activation scale covers.
INPUT_DIMS = {"per_batch": (0, 1, 2, 3), "per_image": (1, 2, 3), "smooth": (0, 1, 2, 3),
              "asymmetric": (0, 1, 2, 3), "fp8": (0, 1, 2, 3)}


def int8_rows(t: torch.Tensor, dims) -> torch.Tensor:
    """t rounded to int8 with one symmetric scale (absmax / 127) per slice along `dims`' complement,
    returned dequantized in t's dtype."""
    f = t.float()
    scale = f.abs().amax(dim=dims, keepdim=True).clamp_min(1e-12) / 127
    return ((f / scale).round().clamp(-127, 127) * scale).to(t.dtype)


def uint8_range(t: torch.Tensor) -> torch.Tensor:
    """t rounded to 256 levels between its minimum and maximum, with 0 a level (an int8 zero
    point), returned dequantized in t's dtype."""
    f = t.float()
    low, high = min(f.min().item(), 0.0), max(f.max().item(), 0.0)
    scale = max(high - low, 1e-12) / 255
    zero = round(-low / scale)
    return ((f / scale).round().add(zero).clamp(0, 255).sub(zero) * scale).to(t.dtype)


def float8(t: torch.Tensor, dims=None) -> torch.Tensor:
    """t scaled so its absmax (over `dims`, default all) is e4m3's largest value (448), rounded to
    float8 e4m3, scaled back."""
    f = t.float()
    dims = dims if dims is not None else tuple(range(t.dim()))
    scale = f.abs().amax(dim=dims, keepdim=True).clamp_min(1e-12) / 448
    return ((f / scale).to(torch.float8_e4m3fn).float() * scale).to(t.dtype)


def smoothing(x: torch.Tensor, w: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """SmoothQuant's per-input-channel factors for a convolution: max|x_c|^a / max|w_c|^(1-a)."""
    xs = x.float().abs().amax(dim=(0, 2, 3)).clamp_min(1e-5)
    ws = w.float().abs().amax(dim=(0, 2, 3)).clamp_min(1e-5)
    return (xs.pow(alpha) / ws.pow(1 - alpha)).clamp_min(1e-5)


def quantized_conv(m, x: torch.Tensor, variant: str) -> torch.Tensor:
    """Convolution `m` of `x` with its weight and input rounded to int8 as `variant` says."""
    w = m.weight
    if variant == "smooth":
        s = smoothing(x, w).view(1, -1, 1, 1)
        x, w = (x.float() / s).to(x.dtype), (w.float() * s).to(w.dtype)
    rounded = {"asymmetric": uint8_range, "fp8": float8}.get(
        variant, lambda t: int8_rows(t, INPUT_DIMS[variant]))(x)
    weight = float8(w, (1, 2, 3)) if variant == "fp8" else int8_rows(w, (1, 2, 3))
    return torch.nn.functional.conv2d(rounded, weight, m.bias, m.stride, m.padding, m.dilation,
                                      m.groups)


def eligible(module) -> bool:
    return (isinstance(module, torch.nn.Conv2d) and module.in_channels % 16 == 0
            and module.out_channels % 16 == 0 and module.groups == 1)


class Quantized:
    """The UNet's eligible convolutions with int8 weights and, for the input variants, int8
    inputs (`linears`: its linear layers' weights instead); undone on exit."""

    def __init__(self, unet, variant: str, only=None):
        if only is not None:  # these convolutions alone
            self.convs = list(only)
        elif variant.startswith("linears"):
            self.convs = [m for m in unet.modules() if isinstance(m, torch.nn.Linear)]
        else:
            self.convs = [m for m in unet.modules() if eligible(m)]
        self.variant, self.saved, self.hooks = variant, [], []

    def __enter__(self):
        for conv in self.convs if self.variant != "none" else []:
            if self.variant in INPUT_DIMS:  # the output replaced by the quantized convolution's
                self.hooks.append(conv.register_forward_hook(
                    lambda m, args, _out: quantized_conv(m, args[0], self.variant)))
                continue
            if self.variant == "linears_w8a8":  # per-token inputs, per-row weights
                self.hooks.append(conv.register_forward_hook(
                    lambda m, args, _out: torch.nn.functional.linear(
                        int8_rows(args[0], (-1,)), int8_rows(m.weight, (1,)), m.bias)))
                continue
            self.saved.append(conv.weight.data)
            conv.weight.data = int8_rows(conv.weight.data, tuple(range(1, conv.weight.dim())))
        return self

    def __exit__(self, *exc):
        for conv, weight in zip(self.convs, self.saved):
            conv.weight.data = weight
        for hook in self.hooks:
            hook.remove()


class LayerErrors:
    """Each eligible convolution's relative output error had its weight and input been int8 as
    input variant `variant` says, on the inputs of an unquantized run: the largest over its
    calls."""

    def __init__(self, unet, variant: str):
        self.errors, self.variant = {}, variant
        self.hooks = [m.register_forward_hook(self._hook(name))
                      for name, m in unet.named_modules() if eligible(m)]

    def _hook(self, name):
        def hook(m, args, out):
            q, ref = quantized_conv(m, args[0], self.variant).float(), out.float()
            err = ((q - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            self.errors[name] = max(self.errors.get(name, 0.0), err)
        return hook

    def summary(self) -> dict:
        for hook in self.hooks:
            hook.remove()
        errors = sorted(self.errors.values())
        worst = sorted(self.errors, key=self.errors.get, reverse=True)[:5]
        return {"layers": len(errors), "median": errors[len(errors) // 2], "max": errors[-1],
                "worst": {name: self.errors[name] for name in worst}}


def images(pipe, a) -> list:
    out = []
    for i, prompt in enumerate(PROMPTS[:a.images]):
        result = pipe(prompt, height=a.size, width=a.size, num_inference_steps=a.steps,
                      guidance_scale=7.5, output_type="np",
                      generator=torch.Generator(a.device).manual_seed(i))
        out.append((result.images[0] * 255).round().astype(np.uint8))
    return out


def compare(reference: list, other: list) -> dict:
    psnrs, largest = [], 0
    for a, b in zip(reference, other):
        diff = a.astype(np.float64) - b.astype(np.float64)
        mse = float(np.mean(diff ** 2))
        psnrs.append(math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse))
        largest = max(largest, int(np.abs(diff).max()))
    finite = [p for p in psnrs if math.isfinite(p)]
    return {"psnr_db": psnrs, "min_psnr_db": min(finite) if finite else None,
            "mean_psnr_db": sum(finite) / len(finite) if finite else None,
            "max_abs_diff": largest}


def first_image(a) -> argparse.Namespace:
    """`a` asking for one image."""
    return argparse.Namespace(**{**vars(a), "images": 1})


def sweep(pipe, a, reference) -> dict:
    """Each eligible convolution rounded alone as `a.sweep` says (first image's PSNR), then every
    one that kept `a.sweep_db` rounded together."""
    one = first_image(a)
    named = [(name, m) for name, m in pipe.unet.named_modules() if eligible(m)]
    alone = {}
    for name, conv in named:
        with Quantized(pipe.unet, a.sweep, only=[conv]):
            alone[name] = compare([reference], images(pipe, one))["psnr_db"][0]
    kept = [conv for name, conv in named if alone[name] >= a.sweep_db]
    with Quantized(pipe.unet, a.sweep, only=kept):
        together = compare([reference], images(pipe, one))["psnr_db"][0]
    out = {"variant": a.sweep, "threshold_db": a.sweep_db, "kept": len(kept),
           "of": len(named), "kept_together_psnr_db": together,
           "alone_psnr_db": dict(sorted(alone.items(), key=lambda kv: kv[1]))}
    print("sweep", json.dumps({k: v for k, v in out.items() if k != "alone_psnr_db"}), flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="sd15")
    p.add_argument("--tokenizer", required=True, help="folder with CLIP's vocab.json, merges.txt")
    p.add_argument("--work", required=True, help="where the diffusers folder is built")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--images", type=int, default=4, choices=range(1, len(PROMPTS) + 1))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: float32, a smoke test with --tiny")
    p.add_argument("--tiny", action="store_true", help="the model's layout at toy widths")
    p.add_argument("--size", type=int, help="image side (default: the model's)")
    p.add_argument("--sweep", choices=sorted(INPUT_DIMS),
                   help="also round one convolution at a time (first image only)")
    p.add_argument("--sweep-db", type=float, default=40.0,
                   help="the PSNR a convolution must keep alone to join the sweep's final set")
    p.add_argument("--out")
    a = p.parse_args()
    a.size = a.size or MODELS[a.model]["size"]
    from diffusers import DDIMScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

    src = os.path.join(a.work, a.model + ("-tiny" if a.tiny else ""))
    if not os.path.exists(os.path.join(src, "model_index.json")):
        build(a.model, src, a.tokenizer, a.device, a.tiny)
    cls = StableDiffusionXLPipeline if a.model == "sdxl" else StableDiffusionPipeline
    dtype = torch.float16 if a.device == "cuda" else torch.float32
    pipe = cls.from_pretrained(src, torch_dtype=dtype).to(a.device)
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    convs = [m for m in pipe.unet.modules() if isinstance(m, torch.nn.Conv2d)]
    result = {"model": a.model, "size": a.size, "steps": a.steps, "images": a.images,
              "guidance_scale": 7.5, "scheduler": "DDIM", "dtype": str(dtype), "tiny": a.tiny,
              "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
              "torch": torch.__version__,
              "unet_convolutions": len(convs),
              "quantized_convolutions": sum(eligible(m) for m in convs), "variants": {}}
    with torch.inference_mode():
        start = time.time()
        reference = images(pipe, a)
        result["seconds_per_variant"] = time.time() - start
        for variant in filter(None, a.variants.split(",")):
            with Quantized(pipe.unet, variant):
                result["variants"][variant] = compare(reference, images(pipe, a))
            print(variant, json.dumps(result["variants"][variant]), flush=True)
        result["layer_relative_error"] = {}
        for variant in INPUT_DIMS:
            errors = LayerErrors(pipe.unet, variant)
            images(pipe, first_image(a))
            result["layer_relative_error"][variant] = errors.summary()
            print(variant, json.dumps(result["layer_relative_error"][variant]), flush=True)
        if a.sweep:
            result["sweep"] = sweep(pipe, a, reference[0])
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
