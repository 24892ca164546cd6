#!/usr/bin/env python3
"""Throughput of one qpool-server under concurrent load, for several pool configurations measured
side by side in one run (one server process, the same workload each time).

  bench/throughput_bench.py --server build/server/qpool-server --repository models \\
      --pipeline sd15 --configs 1gpu,2gpu --concurrency 8 --requests 64 \\
      --out bench/results/throughput_sd15.json

With `--address HOST:PORT` it drives a server that is already running instead of starting one.
With `--device cpu` the server runs on the CPU: `1gpu` is then one replica on the CPU (a smoke run
without a GPU) and configurations needing more devices are skipped with a message.

Configurations, applied in the order given (see CONFIGS):
  1gpu   one replica on cuda:0
  2gpu   replicas on cuda:0 and cuda:1 (LoadPipeline with an explicit device adds a replica)
CONFIG@PIPELINE runs CONFIG on another pipeline of the repository, e.g. a copy of the model whose
manifest enables dynamic batching: `--configs 1gpu,1gpu@sd15-batch8` measures batching off and on
side by side (docs/model-repository.md, `batching`).

The load is bench/loadgen.py's: a closed loop of `--concurrency` clients after `--warmup`
requests sent the same way (so every replica is warm). Every configuration's throughput is
compared with the first one measured.
"""
import argparse
import dataclasses
import sys

import grpc

import loadgen
from generate_bench import host_info, load_stubs, start_server, stop_server, write_results


@dataclasses.dataclass(frozen=True)
class Config:
    """A pool configuration: the pipeline's replicas on the first `replicas` devices of the
    server's kind, on a server started with `server_args`.

    Extension point: a comparison that needs a server option is a pair of Configs that differ in
    `server_args`; the bench restarts its server only when the next configuration's
    `server_args` differ from the running one's (and refuses such configurations with
    --address). Pipeline options (batching) come from the manifest: CONFIG@PIPELINE.
    """
    replicas: int
    server_args: tuple = ()
    description: str = ""


CONFIGS = {
    "1gpu": Config(1, description="one replica on cuda:0 (on the CPU with --device cpu)"),
    "2gpu": Config(2, description="replicas on cuda:0 and cuda:1"),
}
TWO_VS_ONE_TARGET = 1.9


def plan_devices(config, kind, gpus):
    """The devices of `config`'s replicas, or (None, why it cannot run here)."""
    if kind == "cpu":
        if config.replicas > 1:
            return None, f"needs {config.replicas} devices; --device cpu has one"
        return ["cpu"], None
    if config.replicas > gpus:
        return None, f"needs {config.replicas} GPUs; the server has {gpus}"
    return [f"cuda:{i}" for i in range(config.replicas)], None


def replica_devices(models, pb, pipeline):
    for info in models.ListPipelines(pb.ListPipelinesRequest(), timeout=60).pipelines:
        if info.name == pipeline:
            return [r.device for r in info.replicas]
    return []


def set_replicas(models, pb, pipeline, devices):
    """Makes the pipeline's replicas exactly `devices`: loads the missing ones one by one
    (LoadPipeline with an explicit device adds a replica), after unloading the pipeline if it
    has replicas elsewhere. Returns the replicas' devices as the server lists them."""
    current = replica_devices(models, pb, pipeline)
    if set(current) - set(devices):
        models.UnloadPipeline(pb.UnloadPipelineRequest(name=pipeline), timeout=600)
        current = []
    for device in devices:
        if device not in current:
            models.LoadPipeline(pb.LoadPipelineRequest(name=pipeline, device=device), timeout=600)
    return replica_devices(models, pb, pipeline)


class Server:
    """The server the configurations run on: one started here (restarted when a configuration
    needs other flags), or the one at --address."""

    def __init__(self, args):
        self.args, self.proc, self.server_args = args, None, ()
        self.address = args.address

    def ensure(self, server_args):
        """Returns the address of a server with `server_args`, or None (with --address) when
        the running one cannot be given them."""
        if self.args.address:
            return self.address if not server_args else None
        if self.proc is None or server_args != self.server_args:
            self.stop()
            self.proc, self.address, _ = start_server(
                self.args.server, self.args.repository, self.args.device, self.args.cpu_threads,
                extra_args=["--max-queue", str(self.args.max_queue), *server_args])
            self.server_args = server_args
        return self.address

    def stop(self):
        if self.proc is not None:
            stop_server(self.proc)
            self.proc = None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", help="qpool-server binary to start")
    ap.add_argument("--repository", help="model repository of the started server")
    ap.add_argument("--address", help="drive this running server instead (HOST:PORT)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="the server's devices; cpu: one replica on the CPU")
    ap.add_argument("--configs", default="1gpu,2gpu",
                    help="comma-separated, in order: " + ", ".join(CONFIGS))
    loadgen.add_workload_args(ap, pipeline="sd15", width=512, height=512, steps=30, warmup=16)
    ap.add_argument("--cpu-threads", type=int, default=0, help="qpool-server --cpu-threads")
    ap.add_argument("--max-queue", type=int, default=1024, help="qpool-server --max-queue")
    ap.add_argument("--out")
    args = ap.parse_args()
    if not args.address and not (args.server and args.repository):
        ap.error("give --server and --repository, or --address of a running server")
    configs = args.configs.split(",")
    unknown = [c for c in configs if c.split("@")[0] not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown}; known: {', '.join(CONFIGS)}")
    workload = loadgen.workload_from_args(ap, args)

    pb, rpc = load_stubs()
    results = {"client": host_info(), "workload": dataclasses.asdict(workload),
               "device": args.device, "configs": {}}
    summaries = {}
    server = Server(args)
    try:
        for name in configs:
            config = CONFIGS[name.split("@")[0]]
            pipeline = name.split("@")[1] if "@" in name else args.pipeline
            address = server.ensure(config.server_args)
            if address is None:
                why = f"needs server flags {' '.join(config.server_args)}; restart the server"
            else:
                with grpc.insecure_channel(address) as channel:
                    models = rpc.ModelServiceStub(channel)
                    results["server_devices"] = loadgen.server_devices(models, pb)
                    gpus = sum(d["device"].startswith("cuda") for d in results["server_devices"])
                    devices, why = plan_devices(config, args.device, gpus)
                    if devices:
                        replicas = set_replicas(models, pb, pipeline, devices)
            if why:
                print(f"{name}: skipped ({why})", flush=True)
                results["configs"][name] = {"skipped": why}
                continue
            run = loadgen.run_workload(address, dataclasses.replace(workload, pipeline=pipeline),
                                       (pb, rpc))
            summary = loadgen.summarize(run)
            summary["pipeline"] = pipeline
            summary["replicas"] = replicas
            summary["server_args"] = list(config.server_args)
            results["configs"][name] = summaries[name] = summary
            print(f"{name}: {summary['throughput_rps']:.3f} req/s on {','.join(replicas)}, "
                  f"devices {summary['devices']}, batch sizes {summary['batch_sizes']}, "
                  f"codes {summary['codes']}", flush=True)
    finally:
        server.stop()

    if summaries:
        print(loadgen.format_table(summaries))
        baseline = next(iter(summaries))
        results["baseline"] = baseline
        for name, summary in list(summaries.items())[1:]:
            base = summaries[baseline]["throughput_rps"]
            ratio = summary["throughput_rps"] / base if base > 0 else 0.0
            summary["throughput_vs_baseline"] = ratio
            target = (f" (target {TWO_VS_ONE_TARGET}x)"
                      if (baseline, name) == ("1gpu", "2gpu") else "")
            print(f"{name} vs {baseline}: {ratio:.2f}x throughput{target}")
    write_results(args.out, results)
    return 0 if summaries else 1


if __name__ == "__main__":
    sys.exit(main())
