"""The diffusers peers of bench/import_bench.py: the same pipeline timed in Python, eagerly and
compiled the ways diffusers' docs recommend for speed, each peer in a process of its own and
stopped at a time limit (a compiled peer can autotune for longer than a lease lasts)."""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import time

import torch

from generate_bench import summary

# The Python peers: diffusers eagerly, and compiled the ways its docs recommend for speed.
# "max-autotune" is the strongest: UNet and VAE channels-last, the UNet under
# torch.compile(mode="max-autotune") (autotuned kernels and CUDA graphs), the VAE decoder
# compiled too. Its Triton convolution templates autotune for longer than a benchmark can wait on
# SD-sized UNets (over 17 minutes on 16 cores), so "max-autotune-gemm" is the same peer with the
# convolutions left to ATen (cuDNN) and only the matrix products and fused kernels autotuned.
PEERS = ("eager", "reduce-overhead", "max-autotune", "max-autotune-gemm")


def time_diffusers(model: str, src: str, a, peer: str, on_first_image=None) -> dict:
    from diffusers import DDIMScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

    cls = StableDiffusionXLPipeline if model == "sdxl" else StableDiffusionPipeline
    extra = {} if model == "sdxl" else {"safety_checker": None}
    cuda = a.device == "cuda"
    pipe = cls.from_pretrained(src, torch_dtype=torch.float16, **extra).to(a.device)
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    if peer == "reduce-overhead":
        pipe.unet = torch.compile(pipe.unet, mode="reduce-overhead")
    elif peer in ("max-autotune", "max-autotune-gemm"):
        if peer == "max-autotune-gemm":
            import torch._inductor.config as inductor_config
            inductor_config.max_autotune_conv_backends = "ATEN"
        pipe.unet.to(memory_format=torch.channels_last)
        pipe.vae.to(memory_format=torch.channels_last)
        pipe.unet = torch.compile(pipe.unet, mode="max-autotune", fullgraph=True)
        pipe.vae.decode = torch.compile(pipe.vae.decode, mode="max-autotune", fullgraph=True)
    first = time.perf_counter()
    pipe("a red fox in the snow", height=a.size, width=a.size, num_inference_steps=a.steps,
         guidance_scale=a.guidance, num_images_per_prompt=a.batch,
         generator=torch.Generator(a.device).manual_seed(0))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    first_image = time.perf_counter() - first
    if on_first_image:
        on_first_image(first_image)
    times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(a.warmup + a.runs):
        sync()
        start = time.perf_counter()
        pipe("a red fox in the snow", height=a.size, width=a.size, num_inference_steps=a.steps,
             guidance_scale=a.guidance, num_images_per_prompt=a.batch,
             generator=torch.Generator(a.device).manual_seed(i))
        sync()
        if i >= a.warmup:
            times.append(time.perf_counter() - start)
    out = {"latency": summary(times), "first_image_seconds": first_image,
           "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None}
    del pipe
    if cuda:
        torch.cuda.empty_cache()
    return out


def _peer_process(model: str, src: str, args: dict, peer: str, out) -> None:
    """time_diffusers in a process of its own, reporting its first image's time as soon as it
    has it, then its result (or its error)."""
    try:
        timed = time_diffusers(model, src, argparse.Namespace(**args), peer,
                               lambda seconds: out.put(("first_image", seconds)))
        out.put(("result", timed))
    except Exception as e:  # noqa: BLE001 - the parent reports it
        out.put(("error", f"{type(e).__name__}: {e}"))


def time_peer_bounded(model: str, src: str, a, peer: str) -> dict:
    """time_diffusers within a.peer_timeout seconds. A compiled peer can autotune for longer than
    a lease lasts (max-autotune did, for over 17 minutes): it runs in a process of its own,
    killed at the limit, and its entry then says how far it got instead of holding up the
    rest of the run."""
    if not a.peer_timeout:
        return time_diffusers(model, src, a, peer)
    context = multiprocessing.get_context("spawn")  # CUDA is initialised here: no fork
    out = context.Queue()
    child = context.Process(target=_peer_process, args=(model, src, vars(a), peer, out))
    start = time.monotonic()
    child.start()
    first_image = None
    try:
        while True:
            left = start + a.peer_timeout - time.monotonic()
            try:
                kind, value = out.get(timeout=max(left, 0.01))
            except queue.Empty:
                return {"timed_out_after_seconds": a.peer_timeout,
                        "first_image_seconds": first_image,
                        "stopped_while": "timing its runs" if first_image is not None
                        else "compiling and making its first image"}
            if kind == "first_image":
                first_image = value
            elif kind == "error":
                raise RuntimeError(f"diffusers peer {peer}: {value}")
            else:
                return value
    finally:
        if child.is_alive():
            child.kill()
        child.join()
