#!/usr/bin/env python3
"""Every byte the driver counts, named: starts qpool-server on one GPU and, for each pipeline
named, loads it, runs requests, unloads it and empties the cache; after each step it reads qpool's
memory report (Note [Memory arithmetic]) and nvidia-smi's figure for the server's process, and
checks the sums: driver = reserved + context + outside, allocated = tensors + graph pools in use
+ workspaces + working (working 0 at rest), nvidia-smi's figure = qpool's driver figure.

  bench/memory_accounting_bench.py --server build/server/qpool-server --client build/client/qpool \
      --repository REPO --pipelines sd15 --out bench/results/memory_accounting_h200.json
"""
import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20
SLACK = 2 * MIB


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smi_process_bytes(pid):
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        p, used = (x.strip() for x in line.split(","))
        if int(p) == pid:
            return int(used) * MIB
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", required=True)
    p.add_argument("--client", required=True)
    p.add_argument("--repository", required=True)
    p.add_argument("--pipelines", required=True, help="comma-separated")
    p.add_argument("--requests", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    address = f"127.0.0.1:{free_port()}"
    log = tempfile.NamedTemporaryFile(prefix="qpool-memory-bench-", suffix=".log", delete=False)
    server = subprocess.Popen([a.server, "--model-repository", a.repository, "--listen", address,
                               "--devices", "cuda:0"],
                              stdout=log, stderr=subprocess.STDOUT)

    def cli(*args, json_out=False):
        cmd = [a.client, "--server", address] + (["--json"] if json_out else []) + list(args)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
        return json.loads(done.stdout) if json_out else done.stdout

    for _ in range(600):
        if subprocess.run([a.client, "--server", address, "--connect-timeout", "1", "health"],
                          capture_output=True).returncode == 0:
            break
        time.sleep(0.5)
    steps, failures = [], []

    def measure(pipeline, when):
        time.sleep(0.5)  # nvidia-smi's per-process figure lags a little behind frees
        report = cli("memory", json_out=True)
        gpu = next(d for d in report["devices"] if d["device"] == "cuda:0")
        b = gpu.get("breakdown", {})
        smi = smi_process_bytes(server.pid)
        row = dict(pipeline=pipeline, when=when, allocated=gpu["allocated_bytes"],
                   reserved=gpu["reserved_bytes"], pipeline_bytes=gpu["pipeline_bytes"],
                   nvidia_smi_process=smi, **b)
        parts = b["tensor_bytes"] + b["graph_pool_allocated_bytes"] + b["workspace_bytes"]
        checks = {"allocated = tensors + graph pools + workspaces + working":
                  abs(parts + b["working_bytes"] - gpu["allocated_bytes"]) <= SLACK,
                  "working is 0 at rest": b["working_bytes"] <= SLACK}
        if "driver_process_bytes" in b and "context_bytes" in b:
            total = gpu["reserved_bytes"] + b["context_bytes"] + b["outside_allocator_bytes"]
            checks["driver = reserved + context + outside"] = abs(
                total - b["driver_process_bytes"]) <= SLACK
            if smi is not None:  # nvidia-smi rounds to MiB
                checks["nvidia-smi = qpool's driver figure"] = abs(
                    smi - b["driver_process_bytes"]) <= SLACK
        row["checks"] = checks
        steps.append(row)
        failures.extend(f"{pipeline} {when}: {c}" for c, ok in checks.items() if not ok)
        print(f"{pipeline:>8} {when:<12} smi {smi and smi // MIB} MiB; "
              f"driver {b.get('driver_process_bytes', 0) // MIB} = reserved "
              f"{gpu['reserved_bytes'] // MIB} + context {b.get('context_bytes', 0) // MIB} + "
              f"outside {b.get('outside_allocator_bytes', 0) // MIB}; allocated "
              f"{gpu['allocated_bytes'] // MIB} = tensors {b['tensor_bytes'] // MIB} + graphs "
              f"{b['graph_pool_allocated_bytes'] // MIB} + workspaces "
              f"{b['workspace_bytes'] // MIB} + working {b['working_bytes'] // MIB} MiB",
              flush=True)

    try:
        measure("-", "start")
        for name in a.pipelines.split(","):
            cli("load", name)
            measure(name, "load")
            with tempfile.TemporaryDirectory() as images:
                for i in range(a.requests):
                    cli("generate", "--pipeline", name, "--prompt", "a red fox", "--steps",
                        str(a.steps), "--seed", str(i), "--out", images)
            measure(name, "requests")
            cli("unload", name)
            measure(name, "unload")
            cli("empty-cache")
            measure(name, "empty_cache")
    finally:
        server.terminate()
        server.wait(timeout=120)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    with open(a.out, "w") as f:
        json.dump({"device": gpu, "slack_bytes": SLACK, "steps": steps, "failures": failures},
                  f, indent=2)
    print("all sums hold" if not failures else "FAILED:\n" + "\n".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
