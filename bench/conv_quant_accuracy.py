#!/usr/bin/env python3
"""What int8 convolutions cost an image (Note [Int8 convolutions]): the random-weight diffusers
pipeline of bench_models.py generates the same requests with its UNet's convolutions as they are,
then with each convolution's weight and input rounded to int8 as Int8Conv2d takes them, every
other layer unchanged; each variant's decoded images against the unquantized ones (PSNR, largest
difference in 8-bit levels).

Variants: `none` (the unquantized pipeline again: the comparison's floor), `weights`
(per-output-channel int8 weights alone), `per_batch` (and the input with one scale for the whole
batch, guidance's two halves included: what Int8Conv2d computes), `per_image` (one scale per image
of the batch, for comparison). Convolutions whose channel counts are not multiples of 16 (the
UNet's first and last) stay as they are, as in Int8Conv2d. A random-weight UNet can turn small
differences into different images over 30 guided steps, so each convolution's own error is
measured too: during one unquantized generation, ||conv_q(x) - conv(x)|| / ||conv(x)|| on the
input it was given (the largest over the generation's calls).

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
VARIANTS = ("none", "weights", "per_batch", "per_image")
INPUT_DIMS = {"per_batch": (0, 1, 2, 3), "per_image": (1, 2, 3)}


def int8_rows(t: torch.Tensor, dims) -> torch.Tensor:
    """t rounded to int8 with one symmetric scale (absmax / 127) per slice along `dims`' complement,
    returned dequantized in t's dtype."""
    f = t.float()
    scale = f.abs().amax(dim=dims, keepdim=True).clamp_min(1e-12) / 127
    return ((f / scale).round().clamp(-127, 127) * scale).to(t.dtype)


def eligible(module) -> bool:
    return (isinstance(module, torch.nn.Conv2d) and module.in_channels % 16 == 0
            and module.out_channels % 16 == 0 and module.groups == 1)


class Quantized:
    """The UNet's eligible convolutions with int8 weights and, unless `variant` is `weights`, int8
    inputs; undone on exit."""

    def __init__(self, unet, variant: str):
        self.convs = [m for m in unet.modules() if eligible(m)]
        self.variant, self.saved, self.hooks = variant, [], []

    def __enter__(self):
        for conv in self.convs if self.variant != "none" else []:
            self.saved.append(conv.weight.data)
            conv.weight.data = int8_rows(conv.weight.data, (1, 2, 3))
            if self.variant in INPUT_DIMS:
                dims = INPUT_DIMS[self.variant]
                self.hooks.append(conv.register_forward_pre_hook(
                    lambda _m, args, dims=dims: (int8_rows(args[0], dims),) + args[1:]))
        return self

    def __exit__(self, *exc):
        for conv, weight in zip(self.convs, self.saved):
            conv.weight.data = weight
        for hook in self.hooks:
            hook.remove()


class LayerErrors:
    """Each eligible convolution's relative output error had its weight and input been int8 (input
    scales over `dims`), on the inputs of an unquantized run: the largest over its calls."""

    def __init__(self, unet, dims):
        self.errors, self.dims = {}, dims
        self.hooks = [m.register_forward_hook(self._hook(name))
                      for name, m in unet.named_modules() if eligible(m)]

    def _hook(self, name):
        def hook(m, args, out):
            q = torch.nn.functional.conv2d(int8_rows(args[0], self.dims),
                                           int8_rows(m.weight, (1, 2, 3)), m.bias, m.stride,
                                           m.padding, m.dilation, m.groups).float()
            ref = out.float()
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
                      generator=torch.Generator("cuda").manual_seed(i))
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="sd15")
    p.add_argument("--tokenizer", required=True, help="folder with CLIP's vocab.json, merges.txt")
    p.add_argument("--work", required=True, help="where the diffusers folder is built")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--images", type=int, default=4, choices=range(1, len(PROMPTS) + 1))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out")
    a = p.parse_args()
    a.size = MODELS[a.model]["size"]
    from diffusers import DDIMScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

    src = os.path.join(a.work, a.model)
    if not os.path.exists(os.path.join(src, "model_index.json")):
        build(a.model, src, a.tokenizer)
    cls = StableDiffusionXLPipeline if a.model == "sdxl" else StableDiffusionPipeline
    pipe = cls.from_pretrained(src, torch_dtype=torch.float16).to("cuda")
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    convs = [m for m in pipe.unet.modules() if isinstance(m, torch.nn.Conv2d)]
    result = {"model": a.model, "size": a.size, "steps": a.steps, "images": a.images,
              "guidance_scale": 7.5, "scheduler": "DDIM", "dtype": "float16",
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
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
        for variant, dims in INPUT_DIMS.items():
            errors = LayerErrors(pipe.unet, dims)
            images(pipe, argparse.Namespace(**{**vars(a), "images": 1}))
            result["layer_relative_error"][variant] = errors.summary()
            print(variant, json.dumps(result["layer_relative_error"][variant]), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
