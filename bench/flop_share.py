#!/usr/bin/env python3
"""Where a UNet step's arithmetic is: the FLOPs of its linear layers, convolutions and attention
products for one denoising step (CFG: batch 2 per image), counted by PyTorch's FLOP counter on the
diffusers model on the meta device (no memory, no weights). W8A8 quantizes linear layers only,
so their share bounds what it can save.

  bench/flop_share.py --model sd15 [--size 512] [--images 1]
"""
import argparse
import json

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench_models import MODELS, SD15_UNET, SDXL_UNET


# PyTorch's FLOP counter's operators, by the kind of layer that runs them in a UNet.
KINDS = {"addmm": "linear", "mm": "linear", "convolution": "conv", "bmm": "attention",
         "_scaled_dot_product_efficient_attention": "attention",
         "_scaled_dot_product_flash_attention": "attention",
         "_scaled_dot_product_cudnn_attention": "attention"}


def count(model: str, size: int, images: int) -> dict:
    """FLOPs of one UNet call on 2 x images latents of side size / 8, by kind of layer."""
    from diffusers import UNet2DConditionModel

    config = SD15_UNET if model == "sd15" else SDXL_UNET
    batch, side = 2 * images, size // 8
    with torch.device("meta"), torch.no_grad():
        unet = UNet2DConditionModel(**config)
        kwargs = {}
        if model == "sdxl":
            kwargs["added_cond_kwargs"] = {"text_embeds": torch.zeros(batch, 1280),
                                           "time_ids": torch.zeros(batch, 6)}
        with FlopCounterMode(display=False) as counter:
            unet(torch.zeros(batch, 4, side, side), torch.ones(batch),
                 torch.zeros(batch, 77, config["cross_attention_dim"]), **kwargs)
    flops = {"linear": 0, "conv": 0, "attention": 0, "other": 0}
    for op, n in counter.get_flop_counts()["Global"].items():
        flops[KINDS.get(op.__name__.split(".")[0], "other")] += n
    total = sum(flops.values())
    return {"model": model, "size": size, "unet_batch": batch, "gflop": total / 1e9,
            **{f"{k}_share": v / total for k, v in flops.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="sd15")
    ap.add_argument("--size", type=int, default=0, help="default: the model's (512, 1024)")
    ap.add_argument("--images", type=int, default=1, help="images per request")
    a = ap.parse_args()
    print(json.dumps(count(a.model, a.size or MODELS[a.model]["size"], a.images), indent=1))


if __name__ == "__main__":
    main()
