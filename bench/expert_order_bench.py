#!/usr/bin/env python3
"""The routed experts' token order (Note [Routed experts]) on the GPU: two stable radix sorts
(torch.sort, then argsort for the inverse) against expert_order's count (and the same count down
the other dimension), each captured in a CUDA graph and replayed, at HiDream-I1's shapes (4,096 image tokens a 1024x1024 image, top 2 of 4
experts), for 1, 2 and 4 images.

  python3 bench/expert_order_bench.py --out bench/results/expert_order_h200.json
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                                "qpool_export"))
from qpool_export.hidream_experts import expert_order  # noqa: E402


def by_sorting(expert, groups):
    ordered, order = torch.sort(expert, stable=True)
    ids = expert.new_ones(groups).cumsum(0) - 1
    ends = (ordered[None, :] <= ids[:, None]).sum(1).to(torch.int32)
    return order, order.argsort(), ends


def by_counting_columns(expert, groups):
    """The same count down the pairs of [pairs, groups] flags (dimension 0, not innermost)."""
    ids = expert.new_ones(groups).cumsum(0) - 1
    hot = (expert[:, None] == ids[None, :]).to(torch.int32)  # [pairs, groups]
    seen = hot.cumsum(0)
    counts = hot.sum(0)
    ends = counts.cumsum(0)
    place = (ends - counts).index_select(0, expert) + seen.gather(1, expert[:, None])[:, 0] - 1
    pair = expert.new_ones(expert.shape[0]).cumsum(0) - 1
    order = torch.empty_like(pair).index_copy(0, place, pair)
    return order, place, ends.to(torch.int32)


def replay_ms(fn, expert, groups, replays):
    """Milliseconds per replay of a CUDA graph of fn."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(expert, groups)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(expert, groups)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--activated", type=int, default=2)
    ap.add_argument("--replays", type=int, default=500)
    ap.add_argument("--out")
    a = ap.parse_args()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": []}
    for images in (1, 2, 4):
        pairs = images * a.tokens * a.activated
        torch.manual_seed(images)
        expert = torch.randint(0, a.experts, (pairs,), device="cuda")
        sort_ms, want = replay_ms(by_sorting, expert, a.experts, a.replays)
        count_ms, got = replay_ms(expert_order, expert, a.experts, a.replays)
        columns_ms, columns = replay_ms(by_counting_columns, expert, a.experts, a.replays)
        same = all(torch.equal(g, w) for out in (got, columns) for g, w in zip(out, want))
        run = {"images": images, "pairs": pairs, "sort_ms": sort_ms, "expert_order_ms": count_ms,
               "count_down_columns_ms": columns_ms, "expert_order_over_sort": count_ms / sort_ms,
               "same_order": same}
        results["runs"].append(run)
        print(json.dumps(run), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
