"""The importer's host memory and time on full-size pipelines: a FLUX.1-dev- or SDXL-shaped
diffusers folder with random weights (the published configs; built on the GPU when there is one,
saved in bfloat16 / float16) imported by `qpool_export from-diffusers` streamed (Note [Streaming
import]) and, with --modes including `full`, through the full path (--full-check) in the same
run. Each import runs in a process of its own that reports its peak resident memory
(ru_maxrss); the output folder is removed after each, so that a 64 GB disk holds the source and
one import. With --serve SERVER CLIENT the last streamed import is loaded by a qpool-server and
makes one image (its load time and the image's latency are reported).

  python3 bench/import_memory_bench.py --model flux --work /tmp/imb \\
      --tokenizer build/test-models/tiny/tokenizer --quantize transformer=nf4,text_encoder_2=nf4 \\
      --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tools", "qpool_export"))

# An import in a process of its own, which prints its peak resident memory.
PEAK_RSS = """
import resource, sys
sys.path.insert(0, sys.argv[1])
from qpool_export.export import main
code = main(sys.argv[2:])
print("peak-rss-bytes", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, flush=True)
sys.exit(code)
"""


def build_source(a) -> str:
    """The diffusers folder (built once per --work)."""
    src = os.path.join(a.work, f"{a.model}-diffusers")
    if os.path.exists(os.path.join(src, "model_index.json")):
        return src
    if a.model == "flux":
        import flux_bench

        spiece = a.spiece or train_spiece(a.work)
        args = argparse.Namespace(work=a.work, spiece=spiece, tokenizer=a.tokenizer,
                                  tiny=a.tiny, double=19, single=38, t5_layers=24,
                                  device=a.device)
        pipe = flux_bench.build_diffusers(args)
        pipe.save_pretrained(src)
        shutil.copyfile(spiece, os.path.join(src, "tokenizer_2", "spiece.model"))
    else:
        import bench_models

        bench_models.build(a.model, src, a.tokenizer, a.device, tiny=a.tiny)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return src


def train_spiece(work: str) -> str:
    """A SentencePiece model trained on the exporter's prompt corpus (T5's conventions)."""
    import sentencepiece as spm
    from qpool_export import corpus

    text = os.path.join(work, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(corpus.PROMPTS))
    spm.SentencePieceTrainer.train(input=text, model_prefix=os.path.join(work, "spiece"),
                                   vocab_size=300, model_type="unigram", pad_id=0, eos_id=1,
                                   unk_id=2, bos_id=-1, minloglevel=2)
    return os.path.join(work, "spiece.model")


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
               for f in files)


def run_import(a, src: str, mode: str) -> dict:
    out = os.path.join(a.work, "repo", f"{a.model}-{mode}")
    shutil.rmtree(out, ignore_errors=True)
    args = ["from-diffusers", src, "--out", out, "--dtype", a.dtype]
    if a.quantize:
        args += ["--quantize", a.quantize]
    if mode == "full":
        args.append("--full-check")
    return {"mode": mode, **measured(args, out, a.timeout)}


def measured(args, out: str, timeout: int) -> dict:
    """`qpool_export ARGS` writing `out`, in a process of its own: its exit code, time, peak
    resident memory, output size and report."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PEAK_RSS,
                           os.path.join(ROOT, "tools", "qpool_export"), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    seconds = time.monotonic() - start
    entry = {"returncode": done.returncode, "seconds": round(seconds, 1)}
    if done.returncode != 0:
        entry["stderr"] = done.stderr[-2000:]
        return entry
    entry["peak_rss_bytes"] = int(done.stdout.split("peak-rss-bytes")[-1])
    entry["peak_rss_gib"] = round(entry["peak_rss_bytes"] / 2**30, 2)
    entry["output_bytes"] = folder_bytes(out)
    entry["report"] = [line for line in done.stdout.splitlines()
                       if line and not line.startswith("peak-rss-bytes")]
    entry["folder"] = out
    return entry


def serve(a, folder: str) -> dict:
    """Loads the imported pipeline in a qpool-server and makes one image."""
    import generate_bench

    repo = os.path.dirname(folder)
    name = os.path.basename(folder)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    proc, address, _ = generate_bench.start_server(a.serve[0], repo, device, os.cpu_count())
    client = [a.serve[1], "--server", address]
    try:
        start = time.monotonic()
        load = subprocess.run(client + ["load", name], capture_output=True, text=True,
                              timeout=900)
        loaded = time.monotonic() - start
        begin = time.monotonic()
        done = subprocess.run(client + ["generate", "--pipeline", name, "--prompt",
                                        "a red fox in the snow", "--steps", str(a.steps),
                                        "--seed", "1", "--out",
                                        os.path.join(a.work, "image.png")],
                              capture_output=True, text=True, timeout=900)
        return {"load_seconds": round(loaded, 1), "load_returncode": load.returncode,
                "load_stderr": load.stderr[-500:], "returncode": done.returncode,
                "image_seconds": round(time.monotonic() - begin, 2),
                "stdout": done.stdout[-500:], "stderr": done.stderr[-500:]}
    finally:
        generate_bench.stop_server(proc)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("flux", "sdxl", "sd15"), default="flux")
    p.add_argument("--work", required=True)
    p.add_argument("--tokenizer", default=None,
                   help="CLIP vocab.json + merges.txt folder (default: trained on the "
                        "exporter's prompt corpus)")
    p.add_argument("--spiece", default=None, help="T5's SentencePiece model (default: trained)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--quantize", default="")
    p.add_argument("--modes", default="streamed", help="streamed,full")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="toy widths (a smoke test)")
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--serve", nargs=2, metavar=("SERVER", "CLIENT"), default=None)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--keep", action="store_true", help="keep the last import's folder")
    p.add_argument("--build-only", action="store_true", help="build the source folder, no import")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    os.makedirs(a.work, exist_ok=True)
    if a.tokenizer is None:
        from qpool_export import bpe, corpus

        a.tokenizer = os.path.join(a.work, "clip-tokenizer")
        os.makedirs(a.tokenizer, exist_ok=True)
        bpe.write_tokenizer(a.tokenizer, bpe.train_bpe(corpus.PROMPTS, 1000))
    start = time.monotonic()
    src = build_source(a)
    if a.build_only:
        print(json.dumps({"source": src, "seconds": round(time.monotonic() - start, 1),
                          "source_bytes": folder_bytes(src)}))
        return 0
    result = {"model": a.model, "dtype": a.dtype, "quantize": a.quantize,
              "source_bytes": folder_bytes(src),
              "source_build_seconds": round(time.monotonic() - start, 1),
              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "cpus": os.cpu_count(), "imports": []}
    modes = [m for m in a.modes.split(",") if m]
    for i, mode in enumerate(modes):
        entry = run_import(a, src, mode)
        result["imports"].append(entry)
        print(json.dumps(entry), flush=True)
        last = i == len(modes) - 1
        if entry["returncode"] == 0 and a.serve and mode == "streamed":
            result["served"] = serve(a, entry["folder"])
        if entry.get("folder") and not (last and a.keep):
            shutil.rmtree(entry["folder"], ignore_errors=True)
    text = json.dumps(result, indent=1)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
    return 0 if all(e["returncode"] == 0 for e in result["imports"]) else 1


if __name__ == "__main__":
    sys.exit(main())
