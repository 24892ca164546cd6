"""Tests of tools/qpool_export: the exported tiny pipeline folder, its TorchScript components, its
tokenizer files, determinism, sd15 sizes and the command line. CPU only; runs in well under 60 s.

Run: .venv/bin/python -m pytest -q tests/python
"""

import hashlib
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXPORTER = os.path.join(ROOT, "tools", "qpool_export")
sys.path.insert(0, EXPORTER)

from qpool_export import bpe, corpus, export, presets, tracing, weights  # noqa: E402
from qpool_export import weights_file  # noqa: E402

torch.set_num_threads(1)  # tiny ops: one thread is fastest and immune to a loaded CI machine

COMPONENT_FILES = ("text_encoder.pt", "unet.pt", "vae_decoder.pt")
# Keys the server's manifest parser knows (server/config/manifest_parser.h; unknown keys are rejected).
MANIFEST_KEYS = {
    None: {"kind", "components", "tokenizer", "scheduler", "latent", "defaults", "limits",
           "placement"},
    "tokenizer": {"vocab", "merges", "max_length"},
    "scheduler": {"num_train_timesteps", "beta_start", "beta_end", "beta_schedule",
                  "timestep_spacing", "steps_offset", "prediction_type"},
    "latent": {"channels", "downscale", "scaling_factor"},
    "defaults": {"steps", "guidance_scale", "width", "height", "scheduler"},
    "limits": {"max_steps", "max_width", "max_height", "max_images", "max_prompts"},
    "placement": {"device", "dtype"},
}


def jit_load(path):
    """A component: its graph with the weights file beside it bound."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return weights_file.load_component(path)


def load_manifest(folder):
    with open(os.path.join(folder, "pipeline.yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


def run_export(out, *args):
    """Exports in-process through the CLI entry point; returns its exit code."""
    return export.main(["--preset", "tiny", "--out", str(out), "-q", *args])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny pipeline, exported once through the real command line."""
    out = tmp_path_factory.mktemp("repo") / "tiny"
    env = dict(os.environ, PYTHONPATH=EXPORTER, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "qpool_export", "--preset", "tiny", "--out",
                           str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr.lower(), proc.stderr
    return {"dir": str(out), "stdout": proc.stdout}


def test_setup_installs_the_command():
    """scripts/setup.sh installs qpool-export into the project's venv, runnable from anywhere and
    running this checkout's package (an editable install), both of its commands."""
    venv = os.path.join(ROOT, ".venv")
    if os.path.realpath(sys.prefix) != os.path.realpath(venv):
        pytest.skip(f"not the project's venv ({sys.prefix}); scripts/setup.sh makes {venv}")
    command = os.path.join(venv, "bin", "qpool-export")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for args, says in ((["--help"], "usage: qpool-export"),
                       (["from-diffusers", "--help"], "usage: qpool-export from-diffusers")):
        done = subprocess.run([command, *args], cwd="/", env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert says in done.stdout
    where = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                            "import qpool_export; print(qpool_export.__file__)"], cwd="/",
                           env=env, capture_output=True, text=True, timeout=120)
    assert os.path.realpath(where.stdout.strip()).startswith(os.path.realpath(EXPORTER))


def test_export_writes_every_file_and_a_summary_line_per_component(tiny):
    for name in COMPONENT_FILES + ("pipeline.yaml", "tokenizer/vocab.json",
                                   "tokenizer/merges.txt"):
        assert os.path.getsize(os.path.join(tiny["dir"], name)) > 0, name
    lines = tiny["stdout"].splitlines()
    for component in presets.COMPONENTS:
        line = next(line for line in lines if line.startswith(component))
        assert "params" in line and "bytes" in line and f"{component}.pt" in line
    # no staging folder left behind
    assert [e for e in os.listdir(os.path.dirname(tiny["dir"])) if e.startswith(".")] == []


def test_manifest_has_the_documented_fields(tiny):
    m = load_manifest(tiny["dir"])
    assert set(m) <= MANIFEST_KEYS[None]
    for section, keys in MANIFEST_KEYS.items():
        if section is not None and section in m:
            assert set(m[section]) <= keys, section
    assert m["kind"] == "sd"
    assert list(m["components"]) == ["text_encoder", "unet", "vae_decoder"]
    for name, spec in m["components"].items():
        # The graph, the weights file, their SHA-256; no quantization section when not
        # quantized.
        assert list(spec) == ["file", "sha256", "weights"]
        assert spec["file"] == f"{name}.pt"
        assert list(spec["weights"]) == ["file", "sha256"]
        assert spec["weights"]["file"] == f"{name}.safetensors"
        for entry in (spec, spec["weights"]):
            with open(os.path.join(tiny["dir"], entry["file"]), "rb") as f:
                assert entry["sha256"] == hashlib.sha256(f.read()).hexdigest(), name
    assert m["tokenizer"] == {"vocab": "tokenizer/vocab.json", "merges": "tokenizer/merges.txt",
                              "max_length": 77}
    assert m["latent"] == {"channels": 4, "downscale": 8, "scaling_factor": 0.18215}
    assert m["scheduler"]["beta_schedule"] == "scaled_linear"
    assert m["defaults"] == {"steps": 4, "guidance_scale": 7.5, "width": 64, "height": 64,
                             "scheduler": "ddim"}
    assert m["limits"]["max_steps"] == 50 and m["limits"]["max_width"] == 256
    assert m["limits"]["max_height"] == 256 and m["limits"]["max_images"] == 4


def test_components_load_and_produce_the_documented_shapes(tiny):
    d = tiny["dir"]
    te = jit_load(os.path.join(d, "text_encoder.pt"))
    unet = jit_load(os.path.join(d, "unet.pt"))
    vae = jit_load(os.path.join(d, "vae_decoder.pt"))
    with torch.no_grad():
        for batch in (1, 2):
            hidden = te(torch.randint(0, 1514, (batch, 77)))
            assert hidden.shape == (batch, 77, 32) and hidden.dtype == torch.float32
            for h, w in ((8, 8), (4, 12), (5, 7)):
                noise = unet(torch.randn(batch, 4, h, w), torch.full((batch,), 981.0), hidden)
                assert noise.shape == (batch, 4, h, w)
                assert torch.isfinite(noise).all()
                image = vae(torch.randn(batch, 4, h, w))
                assert image.shape == (batch, 3, 8 * h, 8 * w)
                assert torch.isfinite(image).all()


def test_components_hold_no_tensor_constants(tiny):
    for name in COMPONENT_FILES:
        module = jit_load(os.path.join(tiny["dir"], name))
        assert tracing.tensor_constants(module, min_numel=1) == [], name


def test_tensor_constant_scan_names_the_offending_node():
    class Baked(torch.nn.Module):
        def forward(self, x):
            return x + torch.tensor([1.0, 2.0, 3.0, 4.0])  # -> prim::Constant

    traced = tracing.trace(Baked(), (torch.zeros(4),))
    with pytest.raises(tracing.ExportError, match=r"<root>\.forward: prim::Constant tensor of "
                                                  r"shape \(4,\)"):
        tracing.check_no_tensor_constants("baked", traced)


def test_baked_shapes_are_detected():
    class Frozen(torch.nn.Module):
        def forward(self, x):
            return x.sum() + torch.zeros(int(x.shape[0]))  # int() freezes the size

    module = Frozen()
    traced = tracing.trace(module, (torch.zeros(3),))
    with pytest.raises(tracing.ExportError, match="baked"):
        tracing.check_matches_eager("frozen", module, traced, (torch.zeros(5),))


def test_tiny_unet_step_is_fast_on_cpu(tiny):
    import time

    unet = jit_load(os.path.join(tiny["dir"], "unet.pt"))
    args = (torch.randn(2, 4, 8, 8), torch.tensor([999.0, 999.0]), torch.randn(2, 77, 32))
    with torch.no_grad():
        unet(*args)
        start = time.monotonic()
        unet(*args)
    assert time.monotonic() - start < 1.0


def _state(folder, name):
    return jit_load(os.path.join(folder, name)).state_dict()


def test_same_seed_gives_identical_weights_and_tokenizer(tiny, tmp_path):
    # also: --name NAME writes OUT/NAME
    assert export.main(["--preset", "tiny", "--out", str(tmp_path), "--name", "again", "-q"]) == 0
    for name in COMPONENT_FILES:
        a, b = _state(tiny["dir"], name), _state(tmp_path / "again", name)
        assert list(a) == list(b)
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}: {key}"
    for name in ("tokenizer/vocab.json", "tokenizer/merges.txt", "pipeline.yaml"):
        with open(os.path.join(tiny["dir"], name), "rb") as f1, \
                open(tmp_path / "again" / name, "rb") as f2:
            a, b = f1.read(), f2.read()
        if name == "pipeline.yaml":
            # TorchScript archives of equal modules differ in bytes, so do their digests.
            a, b = (b"".join(line for line in x.splitlines(True) if b"sha256:" not in line)
                    for x in (a, b))
        assert a == b, name


def test_other_seed_gives_other_weights():
    preset = presets.TINY.with_vocab(1514)
    for component in presets.COMPONENTS:
        a = weights.build_component(preset, component, seed=0).state_dict()
        b = weights.build_component(preset, component, seed=1).state_dict()
        c = weights.build_component(preset, component, seed=0).state_dict()
        assert any(not torch.equal(a[k], b[k]) for k in a if a[k].is_floating_point())
        assert all(torch.equal(a[k], c[k]) for k in a)


def test_float16_export_then_reexport_replaces_the_folder(tmp_path):
    target = tmp_path / "half"
    assert run_export(target, "--dtype", "float16") == 0
    te = _state(target, "text_encoder.pt")
    assert te["token_embedding.weight"].dtype == torch.float16
    assert te["position_ids"].dtype == torch.int64
    unet = jit_load(os.path.join(target, "unet.pt"))
    # Frequency tables stay float32 (Note [Tensors that keep their dtype]); the rest is float16.
    assert all(t.dtype == (torch.float32 if k.endswith(".freqs") else torch.float16)
               for k, t in unet.state_dict().items())
    assert any(k.endswith(".freqs") for k in unet.state_dict())
    out = unet.float()(torch.randn(1, 4, 8, 8), torch.tensor([10.0]), torch.randn(1, 77, 32))
    assert out.shape == (1, 4, 8, 8)

    (target / "stale.txt").write_text("x")
    assert run_export(target) == 0  # float32 this time
    assert not (target / "stale.txt").exists()
    assert _state(target, "text_encoder.pt")["token_embedding.weight"].dtype == torch.float32
    assert sorted(os.listdir(tmp_path)) == ["half"]  # no staging or backup folder left


# ---- tokenizer ----

def test_vocab_and_merges_have_the_clip_layout(tiny):
    with open(os.path.join(tiny["dir"], "tokenizer", "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(tiny["dir"], "tokenizer", "merges.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[0] == "#version: 0.2" and lines[-1] == ""
    merges = [tuple(line.split(" ")) for line in lines[1:-1]]
    assert len(merges) == 1000 and all(len(m) == 2 for m in merges)
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert len(vocab) == 512 + len(merges) + 2
    by_id = {i: t for t, i in vocab.items()}
    symbols = list(bpe.bytes_to_unicode().values())
    assert [by_id[i] for i in range(256)] == symbols
    assert [by_id[i] for i in range(256, 512)] == [s + "</w>" for s in symbols]
    for rank, (a, b) in enumerate(merges):
        assert by_id[512 + rank] == a + b
        assert a in vocab and b in vocab and "</w>" not in a
    assert by_id[len(vocab) - 2] == "<|startoftext|>" and by_id[len(vocab) - 1] == "<|endoftext|>"
    assert by_id[0] == "!" and by_id[188] == "\u0100"  # byte 0 -> U+0100, after the printables


def test_text_encoder_embedding_covers_the_vocab(tiny):
    te = _state(tiny["dir"], "text_encoder.pt")
    assert te["token_embedding.weight"].shape == (1514, 32)


@pytest.fixture(scope="module")
def tokenizer(tiny):
    tok = os.path.join(tiny["dir"], "tokenizer")
    return bpe.ClipTokenizer(os.path.join(tok, "vocab.json"), os.path.join(tok, "merges.txt"))


PROMPTS = [
    "a photo of an astronaut riding a horse on mars, highly detailed",
    "A  PHOTO\tof a Cat!!  ",
    "it's a café ☕ with 123 zebras &amp; unseenword",
    "Ünïcödé ñ 日本語 — émoji 🐱🚀",
    "<|startoftext|>hello<|endoftext|>",
    "",
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_reference_tokenizer_round_trips(tokenizer, prompt):
    ids = tokenizer.encode(prompt)
    assert all(0 <= i < len(tokenizer.encoder) for i in ids)
    expected = " ".join(bpe.pretokenize(bpe.normalize(prompt), use_regex=False))
    expected = expected.replace("<|startoftext|>", "").replace("<|endoftext|>", "")
    assert tokenizer.decode(ids).split() == expected.split()


def test_reference_tokenizer_known_ids(tokenizer):
    enc = tokenizer.encoder
    # words of the training corpus are whole tokens
    ids = tokenizer.encode("a photo of an astronaut, highly detailed")
    assert ids == [enc[w] for w in ("a</w>", "photo</w>", "of</w>", "an</w>", "astronaut</w>",
                                    ",</w>", "highly</w>", "detailed</w>")]
    # digits are single pre-tokens; an unknown character falls back to its UTF-8 bytes
    assert tokenizer.encode("42") == [enc["4</w>"], enc["2</w>"]]
    b2u = bpe.bytes_to_unicode()
    assert tokenizer.encode("☕") == [enc[b2u[0xE2]], enc[b2u[0x98]], enc[b2u[0x95] + "</w>"]]
    assert tokenizer.encode("it's") == [enc["it</w>"], enc["'s</w>"]]


def test_encode_padded_is_bos_ids_eos_then_eos_padding(tokenizer):
    ids = tokenizer.encode_padded("a cat")
    assert len(ids) == 77
    assert ids[0] == tokenizer.bos_id
    assert ids[1:3] == tokenizer.encode("a cat")
    assert ids[3:] == [tokenizer.eos_id] * 74
    long = tokenizer.encode_padded("cat " * 200)
    assert len(long) == 77 and long[-1] == tokenizer.eos_id
    assert long[1:76] == [tokenizer.encoder["cat</w>"]] * 75


def test_pretokenizer_follows_the_clip_pattern():
    text = "it's ''s a<|endoftext|>b 12x ..!a\u00e9\u00e9 \u0663"
    want = ["it", "'s", "''", "s", "a", "<|endoftext|>", "b", "1", "2", "x", "..!",
            "a\u00e9\u00e9", "\u0663"]
    assert bpe.pretokenize(text, use_regex=False) == want
    if bpe._CLIP_RE is not None:
        assert bpe.pretokenize(text, use_regex=True) == want
        for prompt in corpus.PROMPTS + PROMPTS:
            p = bpe.normalize(prompt)
            assert bpe.pretokenize(p, use_regex=True) == bpe.pretokenize(p, use_regex=False)


def test_bpe_training_is_deterministic_and_bounded():
    a = bpe.train_bpe(corpus.PROMPTS, 300)
    assert a == bpe.train_bpe(corpus.PROMPTS, 300)
    assert len(a) == 300 and len(set(a)) == 300
    full = bpe.train_bpe(corpus.PROMPTS, 10**9)  # runs out of pairs: every word is one token
    assert 1000 < len(full) < 49408 - 514
    assert full[:300] == a


# ---- sd15 sizes (no export: modules are built on the meta device) ----

@pytest.mark.parametrize("component,expected", [
    ("text_encoder", 123.06e6), ("unet", 859.52e6), ("vae_decoder", 49.49e6)])
def test_sd15_parameter_counts(component, expected):
    n = presets.count_parameters(presets.SD15, component, vocab_size=49408)
    assert abs(n - expected) <= 0.05 * expected, n


def test_sd15_latent_downscale_is_8():
    assert presets.SD15.vae_decoder.downscale == 8 and presets.TINY.vae_decoder.downscale == 8


# ---- command line ----

@pytest.mark.parametrize("args,message", [
    (["--preset", "huge", "--out", "x"], "invalid choice"),
    (["--out", "x"], "--preset"),
    (["--preset", "tiny"], "--out"),
    (["--preset", "tiny", "--out", "x/.hidden"], "not a valid pipeline name"),
    (["--preset", "tiny", "--out", "x", "--name", "bad name"], "not a valid pipeline name"),
    (["--preset", "tiny", "--out", "x", "--quantize", "fp8"], "invalid choice"),
    (["--preset", "tiny", "--out", "x", "--quantize", "nf4", "--blocksize", "48"],
     "power of two"),
    (["--preset", "tiny", "--out", "x", "--quantize", "int8", "--double-quant"], "nf4 only"),
    (["--preset", "tiny", "--out", "x", "--quantize", "w8a8", "--blocksize", "64"], "nf4 only"),
    (["--preset", "tiny", "--out", "x", "--blocksize", "64"], "nf4 only"),
    (["--preset", "tiny", "--out", "x", "--quantize", "int8", "--components", "unet,clip"],
     "unknown component"),
    (["--preset", "tiny", "--out", "x", "--components", "unet"], "only with --quantize"),
    (["--preset", "tiny", "--out", "x", "--min-weights", "64"], "only with --quantize"),
    (["--preset", "tiny", "--out", "x", "--quantize", "w8a8", "--min-weights", "-1"],
     "--min-weights must be in [0, 2^31)"),
    (["--preset", "tiny", "--out", "x", "--dtype", "int4"], "invalid choice"),
    (["--preset", "tiny", "--out", "x", "--seed", "-1"], "--seed"),
])
def test_bad_arguments_exit_nonzero_with_a_message(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        export.main(args)
    assert exc.value.code != 0
    assert message in capsys.readouterr().err


def test_refuses_to_replace_a_folder_that_is_not_a_pipeline(tmp_path, capsys):
    target = tmp_path / "models"
    (target / "other").mkdir(parents=True)
    assert run_export(target) == 1
    assert "is not a pipeline folder" in capsys.readouterr().err
    assert (target / "other").is_dir()


def _disk_with_free_bytes(monkeypatch, free):
    real = tracing.shutil.disk_usage

    def usage(path):
        u = real(path)
        return type(u)(u.total, u.total - free, free)

    monkeypatch.setattr(tracing.shutil, "disk_usage", usage)


def test_a_save_without_room_is_refused_before_writing(tmp_path, monkeypatch):
    # Note [Room before a save]: torch.jit.save would abort the process on a full disk.
    traced = tracing.trace(torch.nn.Linear(64, 64), (torch.zeros(1, 64),))
    _disk_with_free_bytes(monkeypatch, tracing.SAVE_MARGIN_BYTES)
    path = tmp_path / "unet.pt"
    with pytest.raises(tracing.ExportError) as e:
        tracing.save("unet", traced, str(path))
    assert f"unet: not enough disk space in {tmp_path}: writing it needs about 0.07 GB, " \
        "0.07 GB free" in str(e.value)
    assert not path.exists()
    _disk_with_free_bytes(monkeypatch, tracing.SAVE_MARGIN_BYTES + (1 << 20))
    tracing.save("unet", traced, str(path))
    assert torch.equal(jit_load(str(path)).weight, traced.weight)


def test_an_export_without_room_fails_cleanly_and_keeps_the_previous_one(tmp_path, monkeypatch,
                                                                         capsys):
    out = tmp_path / "tiny"
    assert run_export(out) == 0
    before = {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in COMPONENT_FILES}
    _disk_with_free_bytes(monkeypatch, 1 << 20)
    assert run_export(out, "--seed", "7") == 1
    assert "text_encoder: not enough disk space in " in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["tiny"]  # no staging folder left behind
    assert {f: hashlib.sha256((out / f).read_bytes()).hexdigest()
            for f in COMPONENT_FILES} == before


def test_count_only_prints_sd15_sizes_without_writing(capsys):
    assert export.main(["--preset", "sd15", "--count-only"]) == 0
    out = capsys.readouterr().out
    assert "unet          params   859,520,964" in out
    assert "text_encoder  params   123,060,480" in out


# ---- quantization (needs qpool_export/quant.py) ----

def _quant_available():
    try:
        from qpool_export import quant  # noqa: F401
    except ImportError:
        return False
    return True


needs_quant = pytest.mark.skipif(not _quant_available(),
                                 reason="qpool_export/quant.py is not there yet")


@needs_quant
@pytest.mark.parametrize("fmt,mode,extra,section", [
    ("int8", "prequantized", [], {"format": "int8"}),
    ("nf4", "prequantized", ["--double-quant"],
     {"format": "nf4", "blocksize": 64, "double_quant": True}),
    ("nf4", "load-time", ["--blocksize", "128"],
     {"format": "nf4", "blocksize": 128, "double_quant": False}),
    ("w8a8", "prequantized", [], {"format": "w8a8"}),
    ("w8a8", "load-time", [], {"format": "w8a8"}),
    ("w8a8", "prequantized", ["--min-weights", "2048"], {"format": "w8a8", "min_weights": 2048}),
    ("w8a8", "load-time", ["--min-weights", "2048"], {"format": "w8a8", "min_weights": 2048}),
])
def test_quantized_export(tmp_path, fmt, mode, extra, section):
    out = tmp_path / f"q-{fmt}"
    assert run_export(out, "--quantize", fmt, "--quant-mode", mode, *extra) == 0
    m = load_manifest(out)
    assert m["components"]["text_encoder"]["quantization"] == section
    assert m["components"]["unet"]["quantization"] == section
    assert "quantization" not in m["components"]["vae_decoder"]
    te = jit_load(os.path.join(out, "text_encoder.pt"))
    unet = jit_load(os.path.join(out, "unet.pt"))
    with torch.no_grad():
        hidden = te(torch.randint(0, 1514, (2, 77)))
        noise = unet(torch.randn(2, 4, 8, 8), torch.tensor([999.0, 1.0]), hidden)
    assert hidden.shape == (2, 77, 32) and noise.shape == (2, 4, 8, 8)
    assert torch.isfinite(noise).all()
    for name in COMPONENT_FILES:
        assert tracing.tensor_constants(jit_load(os.path.join(out, name))) == [], name
    # Note [GEGLU linear op]: prequantized w8a8 feed-forwards take the GEGLU into their output.
    # Note [Norm linear op]: and their norms take the linear that reads them.
    graph = str(unet.inlined_graph)
    fused = "qpool::geglu_quant_linear" in graph
    assert fused == (fmt == "w8a8" and mode == "prequantized"), (fmt, mode, extra)
    norms = graph.count("qpool::layer_norm_quant_linear") + \
        graph.count("qpool::add_layer_norm_quant_linear")
    assert (norms > 0) == fused and ("qpool::layer_norm(" in graph) != fused, (fmt, mode, extra)
    if fmt == "w8a8" and mode == "prequantized":  # int8 weights, activation scales of ones
        buffers = dict(unet.named_buffers())
        int8 = [n[:-len("weight")] for n, b in buffers.items() if b.dtype == torch.int8]
        assert int8 and all(torch.equal(buffers[p + "code"], torch.ones(
            buffers[p + "weight"].shape[1])) for p in int8)
    if "--min-weights" in extra:  # Note [Small layers stay float]
        weights = [m.weight for _, m in unet.named_modules()
                   if m.original_name in ("Linear", "QuantLinear", "GegluQuantLinear",
                                        "NormQuantLinear")]
        small = [w for w in weights if w.numel() < 2048]
        assert small and len(small) < len(weights)
        if mode == "prequantized":  # quantized now: int8 exactly where not small
            assert all((w.dtype == torch.int8) == (w.numel() >= 2048) for w in weights)
        else:  # load-time: all float, the server applies min_weights
            assert all(w.is_floating_point() for w in weights)


def test_exported_unet_has_fused_projections(tiny):
    """The tiny preset's UNet is written with fused projections (Note [Fused projections])."""
    unet = jit_load(os.path.join(tiny["dir"], "unet.pt"))
    names = {n for n, _ in unet.named_modules()}
    assert any(n.endswith("attn1.to_qkv") for n in names), sorted(names)[:20]
    assert any(n.endswith("attn2.to_kv") for n in names)
    assert not any(n.endswith(("attn1.to_q", "attn2.to_k")) for n in names)


# ------------------------------------------------------------------ weights files


def test_a_graph_keeps_placeholders_and_its_weights_file_every_tensor(tiny):
    """Note [Weights beside the graph]: the graph's tensors span one element each; the weights
    file (a safetensors file the library reads) holds each slot's tensor."""
    graph = jit_load(os.path.join(tiny["dir"], "unet.pt"))  # bound
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        bare = torch.jit.load(os.path.join(tiny["dir"], "unet.pt"))
    slots = weights_file.tensor_slots(bare)
    assert slots and all(weights_file.is_placeholder(t) or t.numel() <= 1
                         for t in slots.values())
    stored = weights_file.read_weights(os.path.join(tiny["dir"], "unet.safetensors"))
    assert sorted(stored) == sorted(slots)
    for name, t in weights_file.tensor_slots(graph).items():
        assert torch.equal(t, stored[name]), name
    assert os.path.getsize(os.path.join(tiny["dir"], "unet.pt")) < \
        os.path.getsize(os.path.join(tiny["dir"], "unet.safetensors")) // 4


def test_the_weights_writer_takes_tensors_in_any_order_and_ties_once(tmp_path):
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.arange(5, dtype=torch.int8)
    c = torch.ones(3, dtype=torch.bfloat16)
    plan = [("b", b.dtype, b.shape), ("a", a.dtype, a.shape), ("c", c.dtype, c.shape)]
    path = str(tmp_path / "w.safetensors")
    with weights_file.WeightsWriter(path, plan, weights_file.tied_metadata({"d": "a"})) as out:
        for name, t in (("c", c), ("b", b), ("a", a)):
            out.write(name, t)
    got = weights_file.read_weights(path)  # the safetensors library checks the format
    assert sorted(got) == ["a", "b", "c", "d"]
    assert torch.equal(got["a"], a) and torch.equal(got["b"], b) and torch.equal(got["c"], c)
    assert got["d"] is got["a"]
    reader = weights_file.SafetensorsReader(path)
    assert torch.equal(reader.read("a"), a) and reader.shape("b") == (5,)
    with pytest.raises(weights_file.WeightsFileError, match="1 tensors were not written"):
        with weights_file.WeightsWriter(str(tmp_path / "x.safetensors"), plan) as out:
            out.write("a", a)
            out.write("b", b)
    assert not os.path.exists(tmp_path / "x.safetensors")
    with pytest.raises(weights_file.WeightsFileError, match="the header says"):
        with weights_file.WeightsWriter(str(tmp_path / "y.safetensors"), plan) as out:
            out.write("a", a.to(torch.float16))


def test_the_reader_refuses_files_it_cannot_read(tmp_path):
    path = tmp_path / "w.safetensors"
    with weights_file.WeightsWriter(str(path), [("a", torch.float32, (4,))]) as out:
        out.write("a", torch.ones(4))
    data = path.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:-4])
    with pytest.raises(weights_file.WeightsFileError, match="not the 16 bytes"):
        weights_file.SafetensorsReader(str(cut))
    (tmp_path / "noise.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(weights_file.WeightsFileError, match="not a safetensors file"):
        weights_file.SafetensorsReader(str(tmp_path / "noise.safetensors"))
    (tmp_path / "odd.safetensors").write_bytes(len(b'{"a": 1}').to_bytes(8, "little") +
                                               b'{"a": 1}')
    with pytest.raises(weights_file.WeightsFileError, match="tensor 'a' has an entry"):
        weights_file.SafetensorsReader(str(tmp_path / "odd.safetensors"))
