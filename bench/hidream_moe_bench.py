#!/usr/bin/env python3
"""One HiDream-I1 mixture of experts at its published shapes on one GPU: the per-expert form
(diffusers' moe_infer: nonzero per expert, index_add) against the grouped form qpool's importer
traces (Note [Routed experts] in tools/qpool_export/qpool_export/hidream_experts.py: the
token-expert pairs sorted by expert, two torch._grouped_mm), in bfloat16. Prints the largest
difference between the two, each one's time per call (20 calls after 3 warm-ups, synchronized),
the grouped form with an expert that gets no token, and replayed in a CUDA graph.

  python3 bench/hidream_moe_bench.py
"""

import time

import torch
import torch.nn.functional as F

EXPERTS, TOP, DIM, INNER = 4, 2, 2560, 6912  # HiDream-I1: 4 routed experts, 2 per token


def route(flat, gate):
    scores = F.linear(flat, gate).softmax(-1)
    return torch.topk(scores, k=TOP, dim=-1, sorted=False)


def swiglu(h, weight):
    g, v = h.chunk(2, -1)
    return F.silu(g) * v * weight[:, None]


def per_expert(flat, gate, w13, w2):
    weight, index = route(flat, gate)
    y = torch.zeros_like(flat)
    for i in range(EXPERTS):
        token, slot = (index == i).nonzero(as_tuple=True)
        h = swiglu(flat.index_select(0, token) @ w13[i], weight[token, slot].type_as(flat))
        y = y.index_add(0, token, h @ w2[i])
    return y


def grouped(flat, gate, w13, w2):
    weight, index = route(flat, gate)
    expert, order = torch.sort(index.flatten(), stable=True)
    ids = flat.new_ones(EXPERTS, dtype=torch.int32).cumsum(0) - 1
    ends = (expert[None, :] <= ids[:, None]).sum(1, dtype=torch.int32)
    h = torch._grouped_mm(flat.index_select(0, order // TOP), w13, offs=ends)
    h = swiglu(h, weight.flatten()[order].type_as(flat))
    out = torch._grouped_mm(h, w2, offs=ends)
    return out.index_select(0, order.argsort()).view(-1, TOP, DIM).sum(1)


def ms_per_call(fn, *args, calls=20):
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e3


def main():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    w13 = torch.randn(EXPERTS, DIM, 2 * INNER, device=dev, dtype=dt) / DIM ** .5
    w2 = torch.randn(EXPERTS, INNER, DIM, device=dev, dtype=dt) / INNER ** .5
    for tokens in (4096, 4096 + 4096 // 2 + 77, 1000):
        flat = torch.randn(tokens, DIM, device=dev, dtype=dt)
        gate = torch.randn(EXPERTS, DIM, device=dev, dtype=dt) / DIM ** .5
        a, b = per_expert(flat, gate, w13, w2), grouped(flat, gate, w13, w2)
        print(tokens, "maxdiff", (a.float() - b.float()).abs().max().item(),
              "ref scale", a.float().abs().max().item())
        for fn in (per_expert, grouped):
            print(fn.__name__, ms_per_call(fn, flat, gate, w13, w2), "ms")
    # An expert no token picks.
    flat = torch.randn(4096, DIM, device=dev, dtype=dt)
    gate = torch.randn(EXPERTS, DIM, device=dev, dtype=dt) / DIM ** .5
    gate[3] = -100 * flat.mean(0)
    b = grouped(flat, gate, w13, w2)
    diff = (per_expert(flat, gate, w13, w2).float() - b.float()).abs().max().item()
    print("empty-group maxdiff", diff)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            grouped(flat, gate, w13, w2)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = grouped(flat, gate, w13, w2)
    graph.replay()
    torch.cuda.synchronize()
    print("graph ok", (out.float() - b.float()).abs().max().item())
    print("graph", ms_per_call(graph.replay), "ms")
    offs = torch.tensor([16, 32, 48, 64], device=dev, dtype=torch.int32)
    for other in (torch.float32, torch.float16):
        torch._grouped_mm(flat.to(other)[:64], w13.to(other)[:, :, :64], offs=offs)
        print(other, "cuda ok")


if __name__ == "__main__":
    main()
