"""Imported diffusers pipelines against diffusers itself, side by side on one GPU.

Builds a diffusers Stable Diffusion 1.5- or SDXL-shaped pipeline (--model) from its published
configs with random weights (no hub; the tokenizer files come from --tokenizer), saves it with
save_pretrained, imports it with `qpool_export from-diffusers` (fp16, and the variants --quantize
asks for imported quantized, and those --load-time asks for quantized by the server at load),
serves each with its own qpool-server and times Generate through the qpool CLI, and reads the
device's peak allocated bytes. Then it times the same diffusers pipeline (fp16) as each of
--peers asks (PEERS: eager, or compiled) in the same run: same size, steps, scheduler (DDIM)
and guidance. With --compile, an fp16 twin whose components run AOTInductor packages (and with
--compile-quantized, quantized twins compiled the same way). With --encode-check, the first
pipeline is switched to the `model` offload policy and runs an Encode-only request, after which
nothing of it may be on the GPU. --graphs-off adds a twin of every pipeline with the denoiser's
CUDA graphs off ("<name>-eager", execution.cuda_graphs: false); --warm a twin that warms up at
load ("<name>-warm", execution.warmup: true); --profile records one more request of each
pipeline after its timed ones with the server's profiler and reports its device time by kind of
work (`kernels`). Before the timed servers, one server starts with the first pipeline and makes
one image (`cold_start`): the machine's first server pays for reading its libraries and the
GPU's first use, so every `first_image_seconds` after it is a warm machine's.
Import times are kept in WORK/import_seconds.json across a --prepare-only run and the timed one.
Prints and writes one JSON document, rewritten after every measurement (`complete` is false until
the last), so a run cut short keeps what it measured. Each peer runs in a process of its own,
stopped after --peer-timeout seconds (compiling included): its entry then says how far it got.

  python3 bench/import_bench.py --model sdxl --server build/server/qpool-server \\
      --client build/client/qpool --tokenizer build/test-models/tiny/tokenizer \\
      --work /tmp/import-bench --out result.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tools", "qpool_export"))
from diffusers_peers import PEERS, time_peer_bounded  # noqa: E402
from generate_bench import (GrpcClient, scrape, stages_dict, start_server,  # noqa: E402
                            stop_server, summary)
import kernel_table  # noqa: E402
from bench_models import MODELS, build  # noqa: E402

def execution_variant(repo: str, base: str, name: str, execution: str) -> None:
    """A copy of the pipeline `base` (weights hard-linked) with the manifest's execution section
    `execution` (YAML lines under it), e.g. "  cuda_graphs: false\n" for a denoiser without
    CUDA graphs or "  warmup: true\n" for a warm-up at load."""
    dest = os.path.join(repo, name)
    shutil.copytree(os.path.join(repo, base), dest, copy_function=os.link)
    path = os.path.join(dest, "pipeline.yaml")
    os.unlink(path)  # a link to the base's manifest: write a new file
    with open(os.path.join(repo, base, "pipeline.yaml")) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text + "execution:\n" + execution)


def run_import(src: str, out: str, *args: str) -> float:
    start = time.monotonic()
    path = [os.path.join(ROOT, "tools", "qpool_export"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    subprocess.run([sys.executable, "-m", "qpool_export", "from-diffusers", src, "--out", out,
                    *args], check=True, env=env)
    return time.monotonic() - start


def layer_error_summary(path: str) -> dict:
    """Per component of a --layer-error file: layers, the median and largest relative error,
    the smallest cosine and the three worst layers."""
    with open(path) as f:
        errors = json.load(f)
    from qpool_export.layer_error import worst

    out = {}
    for component, layers in errors.items():
        rel = [e["relative_error"] for e in layers.values()]
        out[component] = {"layers": len(rel), "median_relative_error": statistics.median(rel),
                          "max_relative_error": max(rel),
                          "min_cosine": min(e["cosine"] for e in layers.values()),
                          "worst": {n: layers[n] for n in worst(layers)}}
    return out


# The server's stages of a request (Timings), each summarized beside the latency.
STAGES = ("queue", "encode", "denoise", "decode", "png")


def time_qpool(server_bin: str, client_bin: str, repo: str, name: str, a,
               check_encode: bool, scheduler: str = "ddim", device: str = "cuda:0",
               cold: bool = False, attention: str = "auto") -> dict:
    """Generate latency through the CLI, then the memory report, with `name` alone loaded on
    `device` (and how long the server took to start and load it, with the load's stages); with
    check_encode, then the Encode-only check under `model` offload. With `cold`, only the start
    and one image: the first server on a machine also pays for reading its libraries and the
    GPU's first use, which every later server finds done (main runs one such server before the
    timed ones). `attention`: the server's --attention; other than auto, the images go to
    `name@attention`'s folder."""
    start = time.monotonic()
    label = timed_name(name, attention)
    extra = [] if attention == "auto" else ["--attention", attention]
    profile_dir = None
    if getattr(a, "profile", False) and not cold:
        # Every timed batch runs unrecorded; the one after them is recorded (Note [Batch
        # profiler]), so profiling costs no timed request anything.
        profile_dir = os.path.join(a.work, "profile", label)
        shutil.rmtree(profile_dir, ignore_errors=True)
        os.makedirs(profile_dir)
        extra += ["--profile-dir", profile_dir, "--profile-skip", str(a.warmup + a.runs),
                  "--profile-batches", "1"]
    proc, address, metrics = start_server(server_bin, repo, device, 0,
                                          a.server_args.split() + extra +
                                          ["--metrics-listen", "127.0.0.1:0"])
    try:
        client = GrpcClient(address)
        # Loaded through the API, for the stages of its time (Note [Load stages]).
        loaded = client.models.LoadPipeline(client.pb.LoadPipelineRequest(name=name))
        load_seconds = time.monotonic() - start
        load_stages = stages_dict(loaded.stages)
        columns = ("total", *STAGES)

        def generate(seed: int, out: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [client_bin, "--server", address, "--json", "generate",
                 "--pipeline", name, "--prompt", "a red fox in the snow", "--steps",
                 str(a.steps), "--width", str(a.size), "--height", str(a.size), "--seed",
                 str(seed), "--scheduler", scheduler, "--guidance", str(a.guidance),
                 "--num-images", str(a.batch), "--out", out],
                capture_output=True, text=True)

        rows = []  # each timed request's seconds by column, in order: a slow one can be placed
        for i in range(1 if cold else a.warmup + a.runs):
            done = generate(i, os.path.join(png_dir(a.work, label), "qpool-{seed}-{i}.png"))
            if done.returncode != 0:
                return {"error": done.stderr.strip()[-2000:]}
            timings = json.loads(done.stdout)["timings"]
            if i == 0:
                first_image = timings["total_seconds"]  # graph captures included
                if cold:
                    return {"pipeline": name, "load_seconds": load_seconds,
                            "load_stages": load_stages, "first_image_seconds": first_image}
            if i >= a.warmup:
                rows.append([timings[f"{column}_seconds"] for column in columns])
        pb = client.pb
        report = client.models.GetMemoryReport(pb.GetMemoryReportRequest(max_events=0))
        stats = next(d for d in report.devices if d.device == device)
        components, _ = client.memory(name)
        by_column = dict(zip(columns, map(list, zip(*rows))))
        result = {"load_seconds": load_seconds, "load_stages": load_stages,
                  "first_image_seconds": first_image,
                  "latency": summary(by_column["total"]),
                  **{stage: summary(by_column[stage]) for stage in STAGES},
                  "requests": {"columns": list(columns), "seconds": rows},
                  "peak_allocated_bytes": stats.peak_allocated_bytes,
                  "pipeline_bytes": stats.pipeline_bytes, "components": components,
                  "forwards": forwards_by_path(metrics, name)}
        unused = [c for c, paths in result["forwards"].items()
                  if c in compiled_components(repo, name) and paths.get("compiled", 0) == 0]
        if unused:  # Note [Compiled forward]: the server said why in its log
            result["compiled_unused"] = unused
            print(f"{name}: the compiled forward of {', '.join(unused)} never ran",
                  file=sys.stderr, flush=True)
        if profile_dir:
            done = generate(a.warmup + a.runs, os.path.join(profile_dir, "{seed}-{i}.png"))
            result["kernels"] = (profiled_kernels(profile_dir) if done.returncode == 0 else
                                 {"error": done.stderr.strip()[-2000:]})
        if check_encode:
            result["encode_only_model_offload"] = encode_check(client, name)
        return result
    finally:
        stop_server(proc)


def profiled_kernels(folder: str, timeout: float = 120.0) -> dict:
    """The device time of the batch the server recorded into `folder` (its kernels.tsv, written
    on the worker after the request was answered), by kind of work (bench/kernel_table.py):
    {"table", "header", "total_ms", "groups": {kind: {"ms", "share", "calls", "top"}}}."""
    deadline = time.monotonic() + timeout
    while True:
        tables = sorted(f for f in os.listdir(folder) if f.endswith(".kernels.tsv"))
        if tables or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if not tables:
        return {"error": f"no kernel table in {folder} after {timeout:.0f} s"}
    path = os.path.join(folder, tables[0])
    header, rows = kernel_table.read_table(path)
    groups = kernel_table.group(rows, top=3)
    return {"table": path, "header": header,
            "total_ms": sum(us for _, _, us in rows) / 1e3,
            "groups": {kind: {"ms": e["us"] / 1e3, "share": e["share"], "calls": e["calls"],
                              "top": [[n, us / 1e3] for n, us in e["top"]]}
                       for kind, e in groups.items()}}


def forwards_by_path(metrics: str, name: str) -> dict:
    """{component: {path: forwards}} of pipeline `name` from the server's
    qpool_component_forwards_total (path: compiled or torchscript)."""
    out: dict = {}
    for line in scrape(metrics, ("qpool_component_forwards_total{",)):
        match = re.fullmatch(r'qpool_component_forwards_total\{(.*)\} (\S+)', line)
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if labels.get("pipeline") == name:
            paths = out.setdefault(labels["component"], {})
            paths[labels["path"]] = paths.get(labels["path"], 0) + int(float(match.group(2)))
    return out


def compiled_components(repo: str, name: str) -> list:
    """The components of `name`'s manifest that have a compiled package."""
    import yaml

    with open(os.path.join(repo, name, "pipeline.yaml")) as f:
        manifest = yaml.safe_load(f)
    return [c for c, spec in manifest.get("components", {}).items()
            if isinstance(spec, dict) and "compiled" in spec]


def timed_name(name: str, attention: str) -> str:
    """A result's key: the pipeline's name, with "@cudnn" etc. when served with --attention."""
    return name if attention == "auto" else f"{name}@{attention}"


def png_dir(work: str, name: str) -> str:
    """Where time_qpool keeps `name`'s images, one file per seed and image."""
    folder = os.path.join(work, "png", name)
    os.makedirs(folder, exist_ok=True)
    return folder


def fidelity(work: str, base: str, name: str) -> dict:
    """`name`'s images against `base`'s for the same requests (seed, prompt, size, steps): PSNR
    (dB; None where identical) and the largest difference in 8-bit levels, worst and mean over
    the images both have."""
    import numpy as np

    sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
    from png_reader import read_png  # the tests' stdlib PNG decoder
    try:  # Pillow (diffusers needs it) decodes in C; the stdlib reader takes seconds at 1024²
        from PIL import Image
    except ImportError:
        Image = None

    def pixels(path):
        if Image is not None:
            with Image.open(path) as image:
                return np.asarray(image, dtype=np.uint8).astype(np.float64).ravel()
        with open(path, "rb") as f:
            png = read_png(f.read())
        return np.frombuffer(b"".join(png.rows), dtype=np.uint8).astype(np.float64)

    psnrs, largest = [], 0.0
    for file in sorted(os.listdir(png_dir(work, base))):
        other = os.path.join(png_dir(work, name), file)
        if not os.path.exists(other):
            continue
        a, b = pixels(os.path.join(png_dir(work, base), file)), pixels(other)
        mse = float(np.mean((a - b) ** 2))
        psnrs.append(math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse))
        largest = max(largest, float(np.abs(a - b).max()))
    finite = [p for p in psnrs if math.isfinite(p)]
    return {"images": len(psnrs), "identical": len(psnrs) - len(finite),
            "min_psnr_db": min(finite) if finite else None,
            "mean_psnr_db": statistics.mean(finite) if finite else None,
            "max_abs_diff": largest}


def encode_check(client: GrpcClient, name: str) -> dict:
    """Under `model` offload, an Encode-only request must leave nothing of `name` on the GPU."""
    pb = client.pb
    client.set_policy(name, "model")
    client.models.EmptyCache(pb.EmptyCacheRequest())
    before = client.models.GetMemoryReport(pb.GetMemoryReportRequest(max_events=0))
    base = next(d for d in before.devices if d.device == "cuda:0")
    response = client.inference.Encode(pb.EncodeRequest(
        pipeline=name, prompts=["a red fox in the snow", "a lighthouse at dusk"]))
    after = client.models.GetMemoryReport(pb.GetMemoryReportRequest(max_events=0))
    dev = next(d for d in after.devices if d.device == "cuda:0")
    pipeline = next(p for p in after.pipelines if p.name == name)
    on_gpu = sum(c.weight_bytes + c.quant_state_bytes + c.other_bytes
                 for c in pipeline.components if c.device.startswith("cuda"))
    return {"embeddings_shape": list(response.embeddings.shape),
            "pooled_shape": list(response.pooled_embeddings.shape),
            "allocated_before": base.allocated_bytes, "allocated_after": dev.allocated_bytes,
            "pipeline_bytes_on_gpu_after": on_gpu, "pipeline_bytes_reported": dev.pipeline_bytes,
            "component_devices": {c.name: c.device for c in pipeline.components}}


def time_peers(a, src: str, result: dict, save) -> None:
    """The diffusers peers of --peers into `result`, saved after each; then the whole result."""
    for peer in [p for p in a.peers.split(",") if p] if not a.skip_diffusers else []:
        result[f"diffusers_{peer}"] = time_peer_bounded(a.model, src, a, peer)
        print(f"diffusers_{peer}", json.dumps(result[f"diffusers_{peer}"]), flush=True)
        save(False)
    save(True)
    print(json.dumps(result, indent=1))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(MODELS), default="sd15")
    p.add_argument("--server", required=True)
    p.add_argument("--client", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--quantize", default="nf4",
                   help="comma list of int8, nf4: variants imported quantized")
    p.add_argument("--load-time", default="",
                   help="comma list of int8, nf4: variants imported with --quant-mode load-time "
                        "(the server quantizes them when it loads them)")
    p.add_argument("--size", type=int, default=0, help="default: the model's (512, 1024)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=1, help="images per request")
    p.add_argument("--guidance", type=float, default=7.5)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--peers", default="eager",
                   help=f"comma list of the diffusers peers to time, of {', '.join(PEERS)}")
    p.add_argument("--peer-timeout", type=float, default=1800,
                   help="seconds each diffusers peer may take, compiling included, in a process "
                        "of its own; past it the peer is stopped and reported as such "
                        "(0: no limit, in this process)")
    p.add_argument("--encode-check", action="store_true")
    p.add_argument("--skip-diffusers", action="store_true")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="where everything runs (cpu: a smoke test, with --tiny)")
    p.add_argument("--tiny", action="store_true",
                   help="the model's layout at toy widths (a smoke test of this script)")
    p.add_argument("--skip-qpool", action="store_true",
                   help="only the diffusers peers: no import, no qpool-server (e.g. a slow "
                        "max-autotune peer on a GPU of its own)")
    p.add_argument("--server-args", default="",
                   help="more qpool-server flags, space-separated, e.g. '--max-queue 64'")
    p.add_argument("--attention", default="auto",
                   help="comma list of qpool-server --attention values: every pipeline is timed "
                        "with each ('NAME@cudnn' etc. beside NAME for auto), images compared")
    p.add_argument("--graphs-off", action="store_true",
                   help="add a twin of every pipeline with execution.cuda_graphs off")
    p.add_argument("--warm", action="store_true",
                   help="add a twin of every pipeline that warms up at load (execution.warmup): "
                        "its load_seconds include the warm-up, its first_image_seconds show the "
                        "gain")
    p.add_argument("--profile", action="store_true",
                   help="after each pipeline's timed requests, one more recorded by the server's "
                        "profiler (--profile-dir, Note [Batch profiler]): its device time by "
                        "kind of work (bench/kernel_table.py) goes to the pipeline's `kernels`")
    p.add_argument("--prepare-only", action="store_true",
                   help="build and import the pipelines into --work, then stop (a later run "
                        "with the same --work times them)")
    p.add_argument("--compile", default="",
                   help="comma list of components (unet, vae_decoder, text_encoder): adds the "
                        "fp16 pipeline '<model>-compiled' imported with their forwards compiled "
                        "ahead of time for CUDA (from-diffusers --compile)")
    p.add_argument("--compile-mode", default="default",
                   help="from-diffusers --compile-mode of the compiled pipelines")
    p.add_argument("--smoothquant", type=float, default=None, metavar="ALPHA",
                   help="from-diffusers --smoothquant ALPHA for the w8a8 variants (default: "
                        "activation scales of ones)")
    p.add_argument("--min-weights", type=int, default=0,
                   help="add '<variant>-min' twins of the w8a8 variants imported with "
                        "from-diffusers --min-weights N (their smaller layers in float)")
    p.add_argument("--only-min", action="store_true",
                   help="with --min-weights: only the '-min' twins of the w8a8 variants are "
                        "imported and timed, not the variants themselves")
    p.add_argument("--compile-quantized", default="",
                   help="comma list of formats of --quantize: adds '<model>-FORMAT-compiled', "
                        "the prequantized pipeline with the --compile components compiled too")
    a = p.parse_args()
    if a.compile_quantized and not a.compile:
        p.error("--compile-quantized needs --compile (the components to compile)")
    if a.only_min and not a.min_weights:
        p.error("--only-min needs --min-weights (the twins it keeps)")
    unknown = [peer for peer in a.peers.split(",") if peer and peer not in PEERS]
    if unknown:
        p.error(f"--peers: unknown peer {unknown[0]!r}; known: {', '.join(PEERS)}")
    if a.skip_qpool and a.skip_diffusers:
        p.error("--skip-qpool with --skip-diffusers leaves nothing to time")
    model = MODELS[a.model]
    a.size = a.size or model["size"]
    os.makedirs(a.work, exist_ok=True)
    src = os.path.join(a.work, f"{a.model}-diffusers")
    repo = os.path.join(a.work, "repo")
    start = time.monotonic()
    if not os.path.exists(os.path.join(src, "model_index.json")):
        build(a.model, src, a.tokenizer, a.device, a.tiny)
    result = {"device": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu",
              "torch": torch.__version__,
              "model": a.model, "size": a.size, "steps": a.steps, "batch": a.batch,
              "scheduler": "ddim",
              "guidance": a.guidance, "build_seconds": time.monotonic() - start,
              "smoothquant": a.smoothquant, "import_seconds": {}}
    import diffusers
    import transformers

    result["diffusers"], result["transformers"] = diffusers.__version__, transformers.__version__

    def save(complete: bool) -> None:
        # Written after every measurement, so a run cut short keeps what it measured.
        result["complete"] = complete
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)

    if a.skip_qpool:
        time_peers(a, src, result, save)
        return 0
    seconds_file = os.path.join(a.work, "import_seconds.json")
    if os.path.exists(seconds_file):  # imports of an earlier run (--prepare-only) in this work dir
        with open(seconds_file) as f:
            result["import_seconds"] = json.load(f)
    base = a.model
    names = [base]
    if not os.path.exists(os.path.join(repo, base, "pipeline.yaml")):
        result["import_seconds"][base] = run_import(src, os.path.join(repo, base), "--dtype",
                                                    "float16", "-q")
    if a.compile:
        compiled = f"{base}-compiled"
        names.append(compiled)
        if not os.path.exists(os.path.join(repo, compiled, "pipeline.yaml")):
            result["import_seconds"][compiled] = run_import(
                src, os.path.join(repo, compiled), "--dtype", "float16", "-q", "--compile",
                a.compile, "--compile-device", a.device, "--compile-mode", a.compile_mode)
    variants = [(f, "prequantized", ()) for f in a.quantize.split(",") if f]
    variants += [(f, "load-time", ()) for f in a.load_time.split(",") if f]
    variants += [(f, "prequantized", ("--compile", a.compile, "--compile-device", a.device,
                                      "--compile-mode", a.compile_mode))
                 for f in a.compile_quantized.split(",") if f]
    variants = [(f, m, c, ()) for f, m, c in variants]
    if a.min_weights:  # twins of the w8a8 variants with their small layers in float
        twins = [(f, m, c, ("--min-weights", str(a.min_weights)))
                 for f, m, c, _ in variants if f == "w8a8"]
        if a.only_min:
            variants = [v for v in variants if v[0] != "w8a8"]
        variants += twins
    for fmt, mode, compile_args, min_args in variants:
        name = f"{base}-{fmt}" + ("-min" if min_args else "") + \
            ("-load" if mode == "load-time" else "") + ("-compiled" if compile_args else "")
        names.append(name)
        # Each quantized layer's own error (from-diffusers --layer-error), beside the images'
        # PSNR: the worst layers name candidates to leave in float.
        errors_json = os.path.join(a.work, f"{name}-layer-error.json")
        import_args = ("--layer-error", errors_json) if mode == "prequantized" else ()
        if fmt == "w8a8" and mode == "prequantized" and a.smoothquant is not None:
            import_args += ("--smoothquant", str(a.smoothquant))
        if not os.path.exists(os.path.join(repo, name, "pipeline.yaml")):
            result["import_seconds"][name] = run_import(
                src, os.path.join(repo, name), "--dtype", "float16", "-q", "--quant-mode", mode,
                "--quantize", ",".join(f"{c}={fmt}" for c in model["quantize"]), *compile_args,
                *min_args, *import_args)
        if os.path.exists(errors_json):
            result.setdefault("layer_error", {})[name] = layer_error_summary(errors_json)
    twins = ([("eager", "  cuda_graphs: false\n")] if a.graphs_off else []) + \
        ([("warm", "  warmup: true\n")] if a.warm else [])
    for suffix, execution in twins:
        for name in [n for n in names if not n.endswith(("-eager", "-warm"))]:
            twin = f"{name}-{suffix}"
            if not os.path.exists(os.path.join(repo, twin, "pipeline.yaml")):
                execution_variant(repo, name, twin, execution)
            names.append(twin)
    with open(seconds_file, "w") as f:
        json.dump(result["import_seconds"], f, indent=1)
    print(json.dumps(result), flush=True)
    if a.prepare_only:
        return 0
    # The first server on the machine pays once for what every later one finds done; without
    # this, the first pipeline's first image would include it.
    device = "cuda:0" if a.device == "cuda" else "cpu"
    result["cold_start"] = time_qpool(a.server, a.client, repo, names[0], a, False,
                                      device=device, cold=True)
    print("cold_start", json.dumps(result["cold_start"]), flush=True)
    result["qpool"] = {}
    for name in names:
        for attention in a.attention.split(","):
            key = timed_name(name, attention)
            result["qpool"][key] = time_qpool(
                a.server, a.client, repo, name, a, device=device, attention=attention,
                check_encode=a.encode_check and key == names[0])
            print(key, json.dumps(result["qpool"][key]), flush=True)
            save(False)
    # Accuracy beside speed: every variant's images against the fp16 pipeline's, and each
    # attention backend's against the same pipeline's with PyTorch's order.
    for key, timed in result["qpool"].items():
        name = key.split("@")[0]
        if "error" in timed:
            continue
        if key != base:
            timed[f"fidelity_vs_{base}"] = fidelity(a.work, base, key)
        if key != name and name in result["qpool"]:
            timed[f"fidelity_vs_{name}"] = fidelity(a.work, name, key)
    save(False)
    time_peers(a, src, result, save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
