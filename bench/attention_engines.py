"""How much the choice of attention engine could still win on the UNets' and FLUX's shapes.

The server's attention is `aten::scaled_dot_product_attention`, which on Hopper runs cuDNN's
fused flash attention with the engine configuration cuDNN's heuristics rank first. This times,
per shape, each of ATen's fused backends (cuDNN, flash, memory-efficient) and every engine
configuration cuDNN offers for the same operation graph (heuristic modes A, B and the fallback
list, built through the cuDNN frontend's Python graph API, package `nvidia-cudnn-frontend`), on
the tensors the exported attention blocks hand it: q, k and v as head views of one fused
projection's output, the output written in [batch, tokens, heads, head_dim] order. Each time is
the mean of --iters back-to-back calls between CUDA events after three warm-up calls; each
engine's output is compared with ATen's cuDNN output (max_abs_diff).

  python3 bench/attention_engines.py --out attention_engines.json
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# name, batch rows (four images with CFG unless named b1), heads, query tokens, key tokens, head
# size, dtype.
SHAPES = [
    ("sdxl_64x64_self", 8, 10, 4096, 4096, 64, torch.half),
    ("sdxl_32x32_self", 8, 20, 1024, 1024, 64, torch.half),
    ("sdxl_64x64_cross", 8, 10, 4096, 77, 64, torch.half),
    ("sdxl_32x32_cross", 8, 20, 1024, 77, 64, torch.half),
    ("sdxl_64x64_self_b1", 2, 10, 4096, 4096, 64, torch.half),
    ("sdxl_32x32_self_b1", 2, 20, 1024, 1024, 64, torch.half),
    ("sd15_64x64_self", 8, 8, 4096, 4096, 40, torch.half),
    ("sd15_32x32_self", 8, 8, 1024, 1024, 80, torch.half),
    ("sd15_16x16_self", 8, 8, 256, 256, 160, torch.half),
    ("flux_joint", 1, 24, 4608, 4608, 128, torch.bfloat16),
]
BACKENDS = (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
            SDPBackend.EFFICIENT_ATTENTION)


def time_us(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1000.0


def inputs(batch: int, heads: int, lq: int, lkv: int, d: int, dtype: torch.dtype):
    """q, k, v [batch, heads, tokens, d] as views of fused projections, as the exported
    attention blocks make them (Note [Fused projections])."""
    def heads_of(t: torch.Tensor) -> torch.Tensor:
        return t.view(batch, t.shape[1], heads, d).transpose(1, 2)

    if lq == lkv:
        q, k, v = torch.randn(batch, lq, 3 * heads * d, device="cuda", dtype=dtype).chunk(3, -1)
    else:
        q = torch.randn(batch, lq, heads * d, device="cuda", dtype=dtype)
        k, v = torch.randn(batch, lkv, 2 * heads * d, device="cuda", dtype=dtype).chunk(2, -1)
    return heads_of(q), heads_of(k), heads_of(v)


def engines(q, k, v, reference: torch.Tensor, flops: float, iters: int) -> list[dict]:
    """Every engine configuration cuDNN builds for this attention, timed."""
    import cudnn

    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    io = cudnn.data_type.HALF if q.dtype == torch.half else cudnn.data_type.BFLOAT16
    graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    qt, kt, vt = graph.tensor_like(q), graph.tensor_like(k), graph.tensor_like(v)
    o, _ = graph.sdpa(name="attention", q=qt, k=kt, v=vt, generate_stats=False,
                      attn_scale=1.0 / math.sqrt(q.shape[-1]))
    b, h, lq, d = q.shape
    out = torch.empty(b, lq, h, d, device="cuda", dtype=q.dtype).transpose(1, 2)
    o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride()))
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.B,
                                  cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans(cudnn.build_plan_policy.ALL)
    rows = []
    pack = {qt: q, kt: k, vt: v, o: out}
    for i in range(graph.get_execution_plan_count()):
        row = {"index": i, "engine": graph.get_plan_name_at_index(i)}
        try:
            workspace = torch.empty(max(1, graph.get_workspace_size_plan_at_index(i)),
                                    device="cuda", dtype=torch.uint8)

            def run(i=i, workspace=workspace):
                graph.execute_plan_at_index(pack, workspace, i, handle=handle)

            run()
            row["max_abs_diff"] = (out.float() - reference).abs().max().item()
            row["us"] = time_us(run, iters)
            row["tflops"] = flops / row["us"] / 1e6
        except Exception as e:  # an engine that builds but refuses these tensors
            row["error"] = str(e).splitlines()[0][:200]
        rows.append(row)
    cudnn.destroy_handle(handle)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--iters", type=int, default=40)
    a = p.parse_args()
    results = []
    for name, batch, heads, lq, lkv, d, dtype in SHAPES:
        torch.manual_seed(0)
        q, k, v = inputs(batch, heads, lq, lkv, d, dtype)
        flops = 4.0 * batch * heads * lq * lkv * d
        row = {"name": name, "batch": batch, "heads": heads, "query_tokens": lq,
               "key_tokens": lkv, "head_dim": d, "dtype": str(dtype).replace("torch.", ""),
               "gflop": flops / 1e9}
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            reference = F.scaled_dot_product_attention(q, k, v).float()
        for backend in BACKENDS:
            with sdpa_kernel([backend]):
                def run():
                    return F.scaled_dot_product_attention(q, k, v)

                got = run()
                us = time_us(run, a.iters)
            row["aten_" + backend.name.lower()] = {
                "us": us, "tflops": flops / us / 1e6,
                "max_abs_diff": (got.float() - reference).abs().max().item()}
        row["cudnn_engines"] = engines(q, k, v, reference, flops, a.iters)
        timed = [e["us"] for e in row["cudnn_engines"] if "us" in e]
        if timed:
            row["best_engine_vs_aten_cudnn"] = min(timed) / row["aten_cudnn_attention"]["us"]
        print(f"{name}: ATen cuDNN {row['aten_cudnn_attention']['us']:.1f} us "
              f"({row['aten_cudnn_attention']['tflops']:.0f} TFLOPS), best of "
              f"{len(timed)} engines {min(timed) if timed else float('nan'):.1f} us", flush=True)
        results.append(row)
    with open(a.out, "w") as f:
        json.dump({"benchmark": "bench/attention_engines.py",
                   "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "cudnn": torch.backends.cudnn.version(), "shapes": results}, f, indent=1)


if __name__ == "__main__":
    main()
