#!/usr/bin/env python3
"""What the HTTP API (--http-listen, docs/http-api.md) adds to a request's latency over gRPC:
one qpool-server, the same pipeline and requests through both, side by side, at 1 and 4
concurrent clients.

  bench/http_api_bench.py --server build/server/qpool-server --repository build/test-models \\
      --pipeline tiny --requests 40 --out bench/results/http_api_overhead_cpu.json

Rounds alternate between the two APIs (gRPC, then HTTP, then gRPC, ...) so that a drift of the
host's speed falls on both; each client thread keeps one channel or one keep-alive HTTP
connection. The HTTP client is http.client (the protocol's cost, not a client library's); the
reply is parsed and its images decoded from base64 as a client must. Each client's first
request per API is a warm-up and is not counted.
"""
import argparse
import base64
import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate_bench import (host_info, load_stubs, start_server, stop_server,  # noqa: E402
                            summary, write_results)


def grpc_caller(address, pb2, pb2_grpc, pipeline, fields):
    import grpc
    channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length",
                                                       256 << 20)])
    stub = pb2_grpc.InferenceServiceStub(channel)

    def call(seed):
        request = pb2.GenerateRequest(pipeline=pipeline, seed=seed, **fields)
        for message in stub.Generate(request, timeout=300):
            if message.HasField("result"):
                return [image.png for image in message.result.images]
        raise RuntimeError("no result")
    return call


def http_caller(address, pipeline, fields):
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=300)
    size = f"{fields['width']}x{fields['height']}" if "width" in fields else "auto"
    body = {k: v for k, v in fields.items() if k not in ("width", "height", "num_images")}
    body.update(model=pipeline, size=size, n=fields.get("num_images", 1))

    def call(seed):
        connection.request("POST", "/v1/images/generations", json.dumps(dict(body, seed=seed)),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        reply = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(reply)
        return [base64.b64decode(d["b64_json"]) for d in reply["data"]]
    return call


def run_round(callers, per_client, seeds):
    """Every caller makes `per_client` requests at once with the others; the latencies."""
    latencies, errors = [], []
    lock = threading.Lock()
    start = threading.Barrier(len(callers))

    def client(i, call):
        start.wait()
        for j in range(per_client):
            t = time.perf_counter()
            try:
                call(seeds + 1000 * i + j)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)
                continue
            with lock:
                latencies.append(time.perf_counter() - t)

    threads = [threading.Thread(target=client, args=(i, c)) for i, c in enumerate(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit(f"requests failed: {errors[:3]}")
    return latencies


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--repository", required=True)
    ap.add_argument("--pipeline", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cpu-threads", type=int, default=1)
    ap.add_argument("--requests", type=int, default=40, help="counted requests per API and "
                    "client count")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--out")
    a = ap.parse_args()
    pb2, pb2_grpc = load_stubs()
    proc, address, _ = start_server(a.server, a.repository, a.device, a.cpu_threads,
                                    ["--load", a.pipeline, "--http-listen", "127.0.0.1:0"])
    fields = dict(prompt="a lighthouse at dawn", steps=a.steps, width=a.size, height=a.size)
    results = {"host": host_info(), "pipeline": a.pipeline, "device": a.device,
               "cpu_threads": a.cpu_threads, "steps": a.steps, "size": a.size, "clients": {}}
    try:
        for clients in (int(c) for c in a.clients.split(",")):
            makers = {"grpc": lambda: grpc_caller(address, pb2, pb2_grpc, a.pipeline, fields),
                      "http": lambda: http_caller(proc.http_address, a.pipeline, fields)}
            callers = {api: [make() for _ in range(clients)] for api, make in makers.items()}
            same = [c(7) for c in (callers["grpc"][0], callers["http"][0])]  # and the warm-ups
            assert same[0] == same[1], "the two APIs gave different images for one seed"
            for api in callers:
                run_round(callers[api], 1, 0)
            per_round = max(1, a.requests // (a.rounds * clients))
            latencies = {"grpc": [], "http": []}
            for r in range(a.rounds):
                for api in ("grpc", "http") if r % 2 == 0 else ("http", "grpc"):
                    latencies[api] += run_round(callers[api], per_round, 100 * r)
            entry = {api: summary(v) for api, v in latencies.items()}
            entry["http_over_grpc_p50"] = entry["http"]["median_s"] / entry["grpc"]["median_s"]
            results["clients"][str(clients)] = entry
            print(f"{clients} client(s): gRPC p50 {entry['grpc']['median_s'] * 1e3:.1f} ms, "
                  f"HTTP p50 {entry['http']['median_s'] * 1e3:.1f} ms, "
                  f"HTTP/gRPC {entry['http_over_grpc_p50']:.3f}", flush=True)
    finally:
        stop_server(proc)
    write_results(a.out, results)


if __name__ == "__main__":
    main()
