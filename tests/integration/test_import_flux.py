"""FLUX from diffusers: tiny FluxPipelines built here with random weights (no hub), a
guidance-distilled one shaped like FLUX.1-dev and one without guidance embedding shaped like
FLUX.1-schnell, saved with save_pretrained (plus T5's spiece.model, which FLUX folders ship) and
imported with `python -m qpool_export from-diffusers` as kind `flux`.

Without a server (`-k "not served"`): each traced component equals the diffusers / transformers
module it came from (float32), the manifest says what the server needs (the SentencePiece
tokenizer_2, the flow-matching scheduler, the VAE's shift), and what the importer refuses it
refuses by name, leaving the repository as it was.

With the server (tests named `served`): T5's token ids against T5TokenizerFast, the prompt
embeddings (T5's states and CLIP's pooled embedding) against FluxPipeline.encode_prompt, and
images against FluxPipeline on the same weights and initial latents, with and without the
guidance embedding, several images per request, and an NF4 import (transformer and T5) against
FluxPipeline on the same dequantized weights.

Tolerances: float32 on the CPU through the same operations: embeddings within 1e-5, images
within one 8-bit level.
"""

import copy
import math
import os
import shutil
import sys

import pytest

from png_reader import read_png

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
yaml = pytest.importorskip("yaml")
pytest.importorskip("sentencepiece")  # T5's tokenizer (conftest's tokenizer_files)

import test_import_diffusers as sd_tests  # noqa: E402 - after the skips
from test_import_sdxl import (assert_close, dequantized, one_thread,  # noqa: E402,F401
                              run_import, snapshot)

EXPORTER = sd_tests.EXPORTER
SIZE = sd_tests.SIZE  # pixels; the tiny VAE downscales by 2: 8 x 8 latents, 4 x 4 tokens
T5_LENGTH = 32  # tokenizer_2's model_max_length, FluxPipeline's max_sequence_length here
PROMPT = "a red fox in the snow"
PROMPTS = [PROMPT, "", "A photo of an astronaut,  riding a horse! ÉCOLE ﬁ ½",
           # T5's added tokens, single ids in T5TokenizerFast (and sentinel-like text that is not)
           "a red fox </s> in<extra_id_0>the snow<pad> <unk><extra_id_99> <extra_id_100>",
           "a cat " * 40]  # the last one longer than T5_LENGTH tokens
COMPONENTS = ("text_encoder", "text_encoder_2", "transformer", "vae_decoder")
NF4 = {"transformer": "nf4", "text_encoder_2": "nf4"}
W8A8_MIN_PSNR_DB = 45.0  # measured 58.8 dB on the CPU


def build_flux_pipeline(out, tokenizer_files, guidance_embeds, seed=0):
    """A tiny FluxPipeline with random weights saved to `out` and loaded back: a transformer with
    FLUX's layout (double- and single-stream blocks, 3-axis RoPE; 16 input channels = 2x2
    patches of 4 latent channels), CLIP-L-shaped and T5-v1.1-shaped (gated-gelu) text encoders,
    a VAE with FLUX's scaling and shift factors and no quant convs, and FLUX.1-dev's
    flow-matching scheduler config (FLUX.1-schnell's without guidance embedding)."""
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline,
                           FluxTransformer2DModel)
    from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config,
                              T5EncoderModel, T5TokenizerFast)

    torch.manual_seed(seed)
    clip_dir, spiece = tokenizer_files
    t5_dir = out.parent / f"{out.name}-t5"
    t5_dir.mkdir(parents=True)
    shutil.copyfile(spiece, t5_dir / "spiece.model")
    tokenizer_2 = T5TokenizerFast.from_pretrained(str(t5_dir), model_max_length=T5_LENGTH)
    tokenizer = CLIPTokenizer(str(clip_dir / "vocab.json"), str(clip_dir / "merges.txt"),
                              model_max_length=77)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=77, hidden_act="quick_gelu",
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id))
    text_encoder_2 = T5EncoderModel(T5Config(
        vocab_size=len(tokenizer_2), d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16,
        feed_forward_proj="gated-gelu", dropout_rate=0.0))
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        guidance_embeds=guidance_embeds, axes_dims_rope=(4, 6, 6))
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), latent_channels=4,
        norm_num_groups=8, layers_per_block=1, scaling_factor=0.3611, shift_factor=0.1159,
        use_quant_conv=False, use_post_quant_conv=False)
    if guidance_embeds:  # FLUX.1-dev
        scheduler = FlowMatchEulerDiscreteScheduler(
            shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
            base_image_seq_len=256, max_image_seq_len=4096)
    else:  # FLUX.1-schnell
        scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False)
    pipe = FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder,
                        tokenizer=tokenizer, text_encoder_2=text_encoder_2,
                        tokenizer_2=tokenizer_2, transformer=transformer)
    pipe.save_pretrained(out)
    shutil.copyfile(spiece, out / "tokenizer_2" / "spiece.model")  # as FLUX folders ship it
    return load_pipeline(out)


def load_pipeline(folder):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def sources(tmp_path_factory, tokenizer_files):
    """{name: (diffusers folder, its pipeline)}: flux-dev (guidance embedding), flux-schnell."""
    root = tmp_path_factory.mktemp("flux")
    return {name: (root / name, build_flux_pipeline(root / name, tokenizer_files, guidance))
            for name, guidance in (("flux-dev", True), ("flux-schnell", False))}


def imported_into(repository, name, src, *args):
    done = run_import(src, repository / name, *args)
    assert done.returncode == 0, done.stderr
    # Note [Streaming import]: streamed, unless --full-check compares with diffusers.
    assert ("max diff vs diffusers" if "--full-check" in args else "streamed") in done.stdout
    return repository / name


@pytest.fixture(scope="module")
def imported(tmp_path_factory, sources):
    """{name: pipeline folder}: the float32 imports of `sources` and an NF4 one of flux-dev."""
    repository = tmp_path_factory.mktemp("repo")
    # flux-schnell through the full path (its images are compared with diffusers' as the
    # streamed ones are).
    folders = {name: imported_into(repository, name, folder, "--dtype", "float32",
                                   *(("--full-check",) if name == "flux-schnell" else ()))
               for name, (folder, _) in sources.items()}
    spec = ",".join(f"{c}={f}" for c, f in NF4.items())
    # flux-nf4 from a folder whose T5 tokenizer is a tokenizer.json alone, as transformers 5
    # saves it (Note [T5 from tokenizer.json]).
    json_only = repository.parent / "flux-dev-tokenizer-json"
    shutil.copytree(sources["flux-dev"][0], json_only)
    (json_only / "tokenizer_2" / "spiece.model").unlink()
    folders["flux-nf4"] = imported_into(repository, "flux-nf4", json_only,
                                        "--dtype", "float32", "--quantize", spec)
    # The transformer in w8a8, quantized by the server at load.
    folders["flux-w8a8-load"] = imported_into(repository, "flux-w8a8-load",
                                              sources["flux-dev"][0], "--dtype", "float32",
                                              "--quantize", "transformer=w8a8",
                                              "--quant-mode", "load-time")
    # The transformer's forward also compiled ahead of time for the CPU (Note [Compiled forward]).
    folders["flux-compiled"] = imported_into(repository, "flux-compiled", sources["flux-dev"][0],
                                             "--dtype", "float32", "--compile", "transformer")
    return folders


# ------------------------------------------------------------------ diffusers references


def pack(latents):
    """diffusers' FluxPipeline._pack_latents."""
    from diffusers import FluxPipeline

    b, c, h, w = latents.shape
    return FluxPipeline._pack_latents(latents, b, c, h, w)


def latents_for(seed, images=1):
    """The noise qpool draws for a request with `seed` (image i from a CPU generator seeded with
    seed + i), packed, which FluxPipeline gets as its initial latents."""
    return pack(torch.cat([torch.randn((1, 4, SIZE // 2, SIZE // 2),
                                       generator=torch.Generator().manual_seed(seed + i))
                           for i in range(images)]))


def transformer_inputs(gen, batch, rows, cols, tokens):
    from diffusers import FluxPipeline

    return (torch.randn(batch, rows * cols, 16, generator=gen),
            torch.randn(batch, tokens, 32, generator=gen), torch.randn(batch, 32, generator=gen),
            torch.rand(batch, generator=gen),
            FluxPipeline._prepare_latent_image_ids(batch, rows, cols, "cpu", torch.float32),
            torch.zeros(tokens, 3), torch.full((batch,), 3.5))


# ------------------------------------------------------------------ without a server


@pytest.mark.parametrize("name", ["flux-dev", "flux-schnell"])
def test_traced_components_equal_diffusers(sources, imported, name):
    _, pipe = sources[name]
    sys.path.insert(0, str(EXPORTER))
    from qpool_export import flux_transformer  # noqa: F401 - registers qpool::rope

    load = {c: sd_tests.load_component(imported[name] / f"{c}.pt") for c in COMPONENTS}
    clip_ids = pipe.tokenizer(PROMPTS, padding="max_length", max_length=77, truncation=True,
                              return_tensors="pt").input_ids
    t5_ids = pipe.tokenizer_2(PROMPTS, padding="max_length", max_length=T5_LENGTH,
                              truncation=True, return_tensors="pt").input_ids
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        assert_close(load["text_encoder"](clip_ids), pipe.text_encoder(clip_ids).pooler_output,
                     "text_encoder's pooled output")
        assert_close(load["text_encoder_2"](t5_ids),
                     pipe.text_encoder_2(t5_ids).last_hidden_state, "text_encoder_2")
        for batch, rows, cols, tokens in ((2, 4, 4, T5_LENGTH), (1, 3, 5, 7)):
            args = transformer_inputs(gen, batch, rows, cols, tokens)
            want = pipe.transformer(
                hidden_states=args[0], encoder_hidden_states=args[1], pooled_projections=args[2],
                timestep=args[3], img_ids=args[4], txt_ids=args[5],
                guidance=args[6] if pipe.transformer.config.guidance_embeds else None).sample
            assert_close(load["transformer"](*args), want, f"transformer at {rows}x{cols}")
        z = torch.randn(2, 4, 6, 7, generator=gen)
        assert_close(load["vae_decoder"](z), pipe.vae.decode(z).sample, "vae decoder")


def test_manifest_describes_the_flux_pipeline(imported, tokenizer_files):
    manifest = yaml.safe_load((imported["flux-dev"] / "pipeline.yaml").read_text())
    assert manifest["kind"] == "flux"
    assert list(manifest["components"]) == list(COMPONENTS)
    assert manifest["tokenizer"]["vocab"] == "tokenizer/vocab.json"
    assert manifest["tokenizer_2"] == {"model": "tokenizer_2/spiece.model",
                                       "max_length": T5_LENGTH}
    assert ((imported["flux-dev"] / "tokenizer_2" / "spiece.model").read_bytes()
            == tokenizer_files[1].read_bytes())
    assert manifest["scheduler"] == {"num_train_timesteps": 1000, "shift": 3.0,
                                     "use_dynamic_shifting": True, "base_shift": 0.5,
                                     "max_shift": 1.15, "base_image_seq_len": 256,
                                     "max_image_seq_len": 4096}
    assert manifest["latent"] == {"channels": 4, "downscale": 2, "scaling_factor": 0.3611,
                                  "shift_factor": 0.1159}
    assert manifest["defaults"]["guidance_scale"] == 3.5
    assert manifest["defaults"]["scheduler"] == "euler"
    assert manifest["placement"]["dtype"] == "auto"  # a float32 import
    nf4 = yaml.safe_load((imported["flux-nf4"] / "pipeline.yaml").read_text())
    assert {c: e.get("quantization", {}).get("format", "none")
            for c, e in nf4["components"].items()} == {c: NF4.get(c, "none") for c in COMPONENTS}


edit_json = sd_tests.edit_json

FAILURES = {
    # Without tokenizer.json either (with it alone, the model is rebuilt from it: Note [T5 from
    # tokenizer.json]).
    "spiece.model missing": (lambda s: (os.remove(s / "tokenizer_2" / "spiece.model"),
                                        os.remove(s / "tokenizer_2" / "tokenizer.json")),
                             "tokenizer_2/spiece.model: missing, and no tokenizer.json"),
    "a DDPM scheduler": (
        lambda s: edit_json(s / "scheduler" / "scheduler_config.json",
                            _class_name="EulerDiscreteScheduler"),
        "scheduler_config.json: field '_class_name' is 'EulerDiscreteScheduler'; kind flux "
        "imports FlowMatchEulerDiscreteScheduler"),
    "stochastic sampling": (
        lambda s: edit_json(s / "scheduler" / "scheduler_config.json", stochastic_sampling=True),
        "field 'stochastic_sampling' is True"),
    "linear time shift": (
        lambda s: edit_json(s / "scheduler" / "scheduler_config.json", time_shift_type="linear"),
        "field 'time_shift_type' is 'linear'"),
    "a CLIP tokenizer_2": (
        lambda s: edit_json(s / "model_index.json", tokenizer_2=["transformers", "CLIPTokenizer"]),
        "model_index.json: field 'tokenizer_2' names class 'CLIPTokenizer'; qpool imports "
        "T5TokenizerFast or T5Tokenizer"),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_import_failures_name_the_problem_and_leave_the_repository_untouched(
        sources, imported, tmp_path, case):
    edit, message = FAILURES[case]
    src = sd_tests.broken_copy(sources["flux-dev"][0], tmp_path, edit)
    repository = tmp_path / "repo"
    shutil.copytree(imported["flux-dev"], repository / "flux-dev")
    before = snapshot(repository)
    done = run_import(src, repository / "flux-dev", "--dtype", "float32")
    assert (done.returncode, "Traceback" in done.stderr) == (1, False), done.stderr
    assert message in done.stderr, done.stderr
    assert snapshot(repository) == before


# An import in a process of its own, which prints its peak resident memory (ru_maxrss).
PEAK_RSS = """
import resource, sys
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from qpool_export.export import main
code = main(sys.argv[2:])
print("peak-rss-bytes", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
sys.exit(code)
"""


def import_peak_rss(src, out, *args):
    import subprocess

    done = subprocess.run([sys.executable, "-c", PEAK_RSS, str(EXPORTER), "from-diffusers",
                           str(src), "--out", str(out), *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split("peak-rss-bytes")[-1])


def test_a_transformer_many_times_its_blocks_imports_in_the_memory_of_a_block(sources, tmp_path):
    """Note [Streaming import]: flux-dev with a transformer of 24 single-stream blocks of width
    512 (94M parameters, 377 MB in float32, each block 16 MB) imports in about the memory of its
    small self, blocks of 32 MiB at most; the full path holds much of the transformer more
    (which shows the measurement sees it)."""
    from diffusers import FluxTransformer2DModel

    src = tmp_path / "flux-big"
    shutil.copytree(sources["flux-dev"][0], src, ignore=shutil.ignore_patterns("transformer"))
    torch.manual_seed(3)
    big = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=24, attention_head_dim=64,
        num_attention_heads=8, joint_attention_dim=32, pooled_projection_dim=32,
        guidance_embeds=True, axes_dims_rope=(16, 24, 24))
    model_bytes = 4 * sum(p.numel() for p in big.parameters())
    big.save_pretrained(src / "transformer")
    del big
    args = ("--dtype", "bfloat16", "--quantize", "transformer=nf4")
    small = import_peak_rss(sources["flux-dev"][0], tmp_path / "repo" / "small", *args)
    streamed = import_peak_rss(src, tmp_path / "repo" / "streamed", *args,
                               "--max-block-mib", "32")
    full = import_peak_rss(src, tmp_path / "repo" / "full", *args, "--full-check")
    print(f"peak RSS: small {small >> 20} MiB, streamed {streamed >> 20} MiB, full "
          f"{full >> 20} MiB; transformer {model_bytes >> 20} MiB in float32")
    assert streamed - small < model_bytes // 4
    assert full - streamed > model_bytes // 2
    assert (tmp_path / "repo" / "streamed" / "transformer.safetensors").stat().st_size < \
        model_bytes // 4  # NF4


# ------------------------------------------------------------------ served


@pytest.fixture(scope="module")
def references(sources):
    """{served pipeline: the diffusers pipeline its images should equal}."""
    refs = {name: pipe for name, (_, pipe) in sources.items()}
    refs["flux-nf4"] = dequantized(load_pipeline(sources["flux-dev"][0]), NF4)
    refs["flux-compiled"] = refs["flux-dev"]
    return refs


@pytest.fixture(scope="module")
def client(make_server, imported):
    return make_server(pipelines=(), load="all", folders=imported)


def array(tensor, dtype):
    return np.frombuffer(tensor.data, dtype=dtype).reshape(tuple(tensor.shape))


def test_served_flux_pipelines_are_listed(client):
    pipelines = client.pipelines()
    for name in ("flux-dev", "flux-schnell", "flux-nf4"):
        info = pipelines[name]
        assert info.kind == "flux"
        assert list(info.schedulers) == ["euler", "unipc"]
        assert info.state == client.pb2.PIPELINE_STATE_LOADED, info
        formats = NF4 if name == "flux-nf4" else {}
        assert {c.name: c.quantization for c in info.components} == {
            c: formats.get(c, "none") for c in COMPONENTS}


def test_served_embeddings_match_diffusers(client, sources):
    _, pipe = sources["flux-dev"]
    reply = client.inference.Encode(
        client.pb2.EncodeRequest(pipeline="flux-dev", prompts=PROMPTS), timeout=60)
    ids = pipe.tokenizer_2(PROMPTS, padding="max_length", max_length=T5_LENGTH, truncation=True,
                           return_tensors="pt").input_ids
    assert np.array_equal(array(reply.input_ids, np.int64), ids.numpy())
    with torch.no_grad():
        context, pooled, _ = pipe.encode_prompt(PROMPTS, prompt_2=None,
                                                max_sequence_length=T5_LENGTH)
    got = array(reply.embeddings, np.float32)
    assert got.shape == tuple(context.shape)
    assert np.abs(got - context.numpy()).max() < 1e-5
    got_pooled = array(reply.pooled_embeddings, np.float32)
    assert got_pooled.shape == tuple(pooled.shape)
    assert np.abs(got_pooled - pooled.numpy()).max() < 1e-5


def test_a_t5_tokenizer_json_alone_gives_t5_tokenizer_fasts_ids(client, sources):
    """flux-nf4's T5 model was rebuilt from tokenizer.json (Note [T5 from tokenizer.json]):
    the server's ids equal T5TokenizerFast's, sentinels, Unicode and truncation included."""
    _, pipe = sources["flux-dev"]
    prompts = PROMPTS + ["  many   spaces  ", "日本語のテキスト 🦊", "<extra_id_7> and </s>"]
    reply = client.inference.Encode(
        client.pb2.EncodeRequest(pipeline="flux-nf4", prompts=prompts), timeout=60)
    ids = pipe.tokenizer_2(prompts, padding="max_length", max_length=T5_LENGTH, truncation=True,
                           return_tensors="pt").input_ids
    assert np.array_equal(array(reply.input_ids, np.int64), ids.numpy())


def diffusers_images(pipe, steps, seed, prompt, guidance_scale, images=1, negative_prompt="",
                     true_cfg_scale=None):
    extra = {}
    if true_cfg_scale is not None:
        extra = {"negative_prompt": negative_prompt, "true_cfg_scale": true_cfg_scale}
    with torch.no_grad():
        out = pipe(prompt=prompt, height=SIZE, width=SIZE, num_inference_steps=steps,
                   guidance_scale=guidance_scale, latents=latents_for(seed, images),
                   num_images_per_prompt=images, max_sequence_length=T5_LENGTH,
                   output_type="np", **extra)
    return [np.round(image * 255).astype(np.int16) for image in out.images]


def qpool_images(client, name, steps, seed, prompt, guidance_scale, images=1, negative_prompt="",
                 true_cfg_scale=None, scheduler=""):
    extra = {} if true_cfg_scale is None else {"negative_prompt": negative_prompt,
                                               "true_cfg_scale": true_cfg_scale}
    if scheduler:
        extra["scheduler"] = scheduler
    result = client.generate_one(pipeline=name, prompt=prompt, steps=steps,
                                 guidance_scale=guidance_scale, width=SIZE, height=SIZE,
                                 seed=seed, num_images=images, **extra)
    out = []
    for image in result.images:
        png = read_png(image.png)
        assert (png.width, png.height, png.channels) == (SIZE, SIZE, 3)
        out.append(np.frombuffer(b"".join(png.rows), dtype=np.uint8)
                   .reshape(SIZE, SIZE, 3).astype(np.int16))
    return out


CASES = {
    "dev, guidance 3.5": ("flux-dev", dict(steps=4, guidance_scale=3.5)),
    "dev, guidance 7, two images": ("flux-dev", dict(steps=3, guidance_scale=7.0, images=2)),
    "schnell": ("flux-schnell", dict(steps=2, guidance_scale=0.0)),
    "dev, true CFG 4 with a negative prompt, two images": (
        "flux-dev", dict(steps=3, guidance_scale=3.5, images=2, negative_prompt="blurry, dark",
                         true_cfg_scale=4.0)),
    "schnell, true CFG 2.5": ("flux-schnell", dict(steps=2, guidance_scale=0.0,
                                                   negative_prompt="a cat", true_cfg_scale=2.5)),
    # An empty negative prompt that is set runs true CFG against "", as FluxPipeline does.
    "dev, true CFG 3 with an empty negative prompt": (
        "flux-dev", dict(steps=3, guidance_scale=3.5, negative_prompt="", true_cfg_scale=3.0)),
    "nf4 transformer and T5": ("flux-nf4", dict(steps=4, guidance_scale=3.5)),
}


def test_served_w8a8_transformer_stays_close_to_full_precision(client):
    """The transformer quantized to w8a8 at load (int8 activations per token, int8 weights per
    channel: Note [W8A8 linear]) against the same weights in float, same seed."""
    info = client.pipelines()["flux-w8a8-load"]
    assert {c.name: c.quantization for c in info.components}["transformer"] == "w8a8"
    request = dict(steps=4, guidance_scale=3.5)
    got = qpool_images(client, "flux-w8a8-load", seed=11, prompt=PROMPT, **request)[0]
    want = qpool_images(client, "flux-dev", seed=11, prompt=PROMPT, **request)[0]
    mse = np.mean((got.astype(np.float64) - want.astype(np.float64)) ** 2)
    psnr = 10 * np.log10(255.0 ** 2 / mse) if mse else math.inf
    print(f"W8A8_PSNR_MEASURED {psnr:.2f} dB")
    assert 0 < mse and psnr >= W8A8_MIN_PSNR_DB, f"PSNR {psnr:.2f} dB"
    assert want.std() > 5, "a flat reference image compares nothing"


def test_compiled_transformer_matches_diffusers(client, imported, references):
    """--compile transformer: the server runs the transformer's AOTInductor package (its
    generated kernels round differently from TorchScript's ops: a level or two of 255), for one
    image and for two with true CFG (a batch of 4)."""
    text = (imported["flux-compiled"] / "pipeline.yaml").read_text()
    assert "file: transformer.cpu.pt2" in text and "device: cpu" in text
    for request in (dict(steps=4, guidance_scale=3.5),
                    dict(steps=3, guidance_scale=3.5, images=2, negative_prompt="blurry, dark",
                         true_cfg_scale=4.0)):
        want = diffusers_images(references["flux-compiled"], seed=11, prompt=PROMPT, **request)
        got = qpool_images(client, "flux-compiled", seed=11, prompt=PROMPT, **request)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert np.abs(g - w).max() <= 3
            assert w.std() > 5, "a flat reference image compares nothing"
    log = client.server.stderr_text() + "\n".join(client.server.stdout_lines)
    assert "compiled forward" in log, "the package was not attached"


@pytest.mark.parametrize("case", list(CASES))
def test_served_images_match_diffusers(client, references, case):
    name, request = CASES[case]
    want = diffusers_images(references[name], seed=11, prompt=PROMPT, **request)
    got = qpool_images(client, name, seed=11, prompt=PROMPT, **request)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.abs(g - w).max() <= 1, f"{case}, image {i}"
        assert w.std() > 5, "a flat reference image compares nothing"


def test_served_unipc_images_match_diffusers(client, references):
    """scheduler unipc: diffusers' UniPCMultistepScheduler on flow sigmas, dynamically shifted
    with FluxPipeline's mu (Note [Flow-matching UniPC]); 4 steps take both orders and the
    corrector."""
    from diffusers import UniPCMultistepScheduler

    pipe = copy.copy(references["flux-dev"])  # the fixture's pipeline keeps its own scheduler
    pipe.scheduler = UniPCMultistepScheduler(use_flow_sigmas=True, use_dynamic_shifting=True,
                                             prediction_type="flow_prediction", flow_shift=3.0)
    want = diffusers_images(pipe, 4, 11, PROMPT, 3.5)[0]
    got = qpool_images(client, "flux-dev", 4, 11, PROMPT, 3.5, scheduler="unipc")[0]
    assert want.std() > 5, "a flat reference image compares nothing"
    assert np.abs(got - want).max() <= 1
    euler = qpool_images(client, "flux-dev", 4, 11, PROMPT, 3.5)[0]
    assert np.abs(euler - want).max() > 1, "the two samplers make the same image"


def test_served_guidance_changes_the_image_of_a_distilled_model_only(client):
    """The guidance scale is the transformer's input: it changes flux-dev's image and, without
    a guidance embedding, not flux-schnell's."""
    for name, changes in (("flux-dev", True), ("flux-schnell", False)):
        low, high = (qpool_images(client, name, 2, 5, PROMPT, g)[0] for g in (1.0, 9.0))
        assert (np.abs(low - high).max() > 0) == changes, name


# ------------------------------------------------------------------ GPUs


def gpu_count():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(gpu_count() < 1, reason="needs a GPU")
def test_served_bf16_flux_on_a_gpu_repeats_its_images_from_graphs(server_bin, pb, sources,
                                                                  tmp_path):
    """FLUX as it is served: bfloat16 on a GPU, and with the transformer and T5 in NF4. Three
    requests with one seed give the same images while the transformer and both text encoders go
    from their eager warm-up to CUDA graphs (Note [Forward graphs]), which hold graph memory
    that the memory report attributes to them, and no capture fails."""
    from conftest import Client, QpoolServer

    repository = tmp_path / "models"
    imported_into(repository, "flux-dev", sources["flux-dev"][0], "--dtype", "bfloat16")
    spec = ",".join(f"{c}={f}" for c, f in NF4.items())
    imported_into(repository, "flux-nf4", sources["flux-dev"][0], "--dtype", "bfloat16",
                  "--quantize", spec)
    server = QpoolServer(server_bin, repository, tmp_path, load="all", device="cuda")
    server.start()
    client = Client(server, pb)
    try:
        models, pb2 = client.models, client.pb2
        for name in ("flux-dev", "flux-nf4"):
            first, *later = (qpool_images(client, name, 3, 21, PROMPT, 3.5)[0] for _ in range(3))
            for image in later:
                assert np.array_equal(image, first), name
            report = models.GetMemoryReport(pb2.GetMemoryReportRequest(max_events=0))
            pipeline = next(p for p in report.pipelines if p.name == name)
            assert {c.name: c.device for c in pipeline.components} == {
                c: "cuda:0" for c in COMPONENTS}
            graphs = {c.name: c.graph_bytes for c in pipeline.components}
            for component in ("text_encoder", "text_encoder_2", "transformer"):
                assert graphs[component] > 0, (name, graphs)
    finally:
        client.close()
        code = server.stop()
    assert "CUDA graph failed" not in server.stderr_text()
    assert code == 0, server.stderr_text()


@pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs")
def test_served_nf4_flux_moved_to_the_second_gpu(server_bin, pb, imported, tmp_path):
    """The field report's case: an NF4 FLUX pipeline loaded on cuda:0 and moved to cuda:1 keeps
    every tensor (quant state included) on cuda:1, gives cuda:0 its memory back, and generates
    the same image there."""
    from conftest import Client, QpoolServer, copy_placed

    repository = tmp_path / "models"
    copy_placed(imported["flux-nf4"], repository, "flux-nf4", device="cuda:0,cuda:1",
                dtype="float32")
    server = QpoolServer(server_bin, repository, tmp_path, load=None, device="cuda")
    server.start()
    client = Client(server, pb)
    try:
        models, pb2, allocated = client.models, client.pb2, client.allocated

        def load_on_cuda0():
            models.LoadPipeline(pb2.LoadPipelineRequest(name="flux-nf4", device="cuda:0"),
                                timeout=300)
            return qpool_images(client, "flux-nf4", 3, 21, PROMPT, 3.5)[0]

        # The first generation on cuda:0 leaves the libraries' per-stream workspaces there
        # (cuBLAS: 33 MiB on an H100) for the server's life; they are not the pipeline's bytes,
        # so the baseline is taken after one load, generation and unload.
        load_on_cuda0()
        models.UnloadPipeline(pb2.UnloadPipelineRequest(name="flux-nf4"), timeout=300)
        baseline = allocated("cuda:0")
        before = load_on_cuda0()
        assert allocated("cuda:0") > baseline
        moved = models.MovePipeline(pb2.MovePipelineRequest(name="flux-nf4", device="cuda:1"),
                                    timeout=300)
        assert moved.pipeline.device == "cuda:1"
        report = models.GetMemoryReport(pb2.GetMemoryReportRequest(max_events=0))
        pipeline = next(p for p in report.pipelines if p.name == "flux-nf4")
        assert {c.name: c.device for c in pipeline.components} == {c: "cuda:1" for c in COMPONENTS}
        quant_state = {c.name: c.quant_state_bytes for c in pipeline.components}
        assert quant_state["transformer"] > 0 and quant_state["text_encoder_2"] > 0
        assert allocated("cuda:0") == baseline
        after = qpool_images(client, "flux-nf4", 3, 21, PROMPT, 3.5)[0]
        assert np.abs(after - before).max() <= 1
    finally:
        client.close()
        assert server.stop() == 0, server.stderr_text()
