"""Bring your own model: small diffusers Stable Diffusion pipelines built here with random
weights (no hub), saved with save_pretrained, imported with `python -m qpool_export
from-diffusers`, served by the real server and compared with the same diffusers pipeline run in
Python on the same weights and the same initial latents: the prompt embeddings, one denoising
step and a few steps' decoded images, for epsilon and v-prediction, with DDIM, Euler and
Euler ancestral, DPM-Solver++ 2M (on the model's timesteps and on Karras sigmas, and its SDE
form) and UniPC.

Tolerances: everything runs in float32 on the CPU in both, through the same operations
(qpool's modules are diffusers' architecture with its parameter names, Note [Importing through
qpool's modules]), so embeddings agree to float32 rounding (1e-5) and decoded 8-bit images to
one level per pixel (a value on a rounding boundary may land on either side).
"""

import contextlib
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import traceback
from unittest import mock

import pytest

from conftest import parse_samples, scrape
from png_reader import read_png

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXPORTER = ROOT / "tools" / "qpool_export"
SIZE = 16  # pixels; the tiny VAE downscales by 2, so latents are 8 x 8


def load_component(path):
    """A component qpool wrote: its graph with the tensors of the weights file beside it, and the
    Python references of the ops its graphs call registered (qpool_export.quant:
    qpool::quant_linear, qpool::geglu, qpool::group_norm)."""
    sys.path.insert(0, str(EXPORTER))
    from qpool_export import weights_file

    return weights_file.load_component(str(path))


def build_diffusers_pipeline(out, tokenizer_dir, prediction_type="epsilon", seed=0, sd2=False):
    """A tiny diffusers pipeline with random weights, saved to `out` and loaded back: SD 1.x
    shaped, or with `sd2` SD 2.x shaped (linear projections in the transformers, heads per block,
    an OpenCLIP-like text encoder with gelu that pads prompts with "!")."""
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=SIZE // 2, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
        attention_head_dim=(2, 4) if sd2 else 4, use_linear_projection=sd2, norm_num_groups=8)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32), latent_channels=4,
        norm_num_groups=8, layers_per_block=1)
    tokenizer = CLIPTokenizer(str(tokenizer_dir / "vocab.json"), str(tokenizer_dir / "merges.txt"),
                              model_max_length=77, **({"pad_token": "!"} if sd2 else {}))
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=77, bos_token_id=tokenizer.bos_token_id,
        hidden_act="gelu" if sd2 else "quick_gelu",
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    scheduler = PNDMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              skip_prk_steps=True, steps_offset=1, set_alpha_to_one=False,
                              prediction_type=prediction_type)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                                   unet=unet, scheduler=scheduler, safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    pipe.save_pretrained(out)
    # What a user has: the pipeline as loaded from its folder (an in-memory config marks unset
    # fields as defaults, which from_config would then replace by another class's defaults).
    loaded = StableDiffusionPipeline.from_pretrained(out, safety_checker=None)
    loaded.set_progress_bar_config(disable=True)
    return loaded


def run_import(src, out, *args, command="from-diffusers"):
    """`python -m qpool_export COMMAND SRC --out OUT ARGS` (from-diffusers, from-single-file), run
    in this process on one torch thread (a subprocess spent most of its time importing torch,
    diffusers and transformers again); its exit code, stdout and stderr as subprocess.run reports them, a traceback in
    stderr if the importer raised."""
    if str(EXPORTER) not in sys.path:
        sys.path.insert(0, str(EXPORTER))
    from qpool_export.export import main

    stdout, stderr = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with mock.patch.dict(os.environ, HF_HUB_OFFLINE="1"), \
                contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main([command, str(src), "--out", str(out), *args])
            except SystemExit as e:  # argparse's errors (2)
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
            except Exception:  # noqa: BLE001 (the tests assert there is no traceback)
                traceback.print_exc()
                code = 1
    finally:
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess([command, str(src)], code, stdout.getvalue(),
                                       stderr.getvalue())


@pytest.fixture(scope="module")
def imported(tmp_path_factory, source_repository):
    """{name: diffusers pipeline} of the pipelines imported into one repository, and its path."""
    work = tmp_path_factory.mktemp("diffusers")
    tokenizer_dir = pathlib.Path(source_repository) / "tiny" / "tokenizer"
    repository = work / "imported"
    pipes = {}
    # Streamed imports (Note [Streaming import]) but sd-v's, through the full path with its check
    # against diffusers: the images of all are compared with diffusers'.
    for name, prediction, sd2 in (("sd-eps", "epsilon", False), ("sd-v", "v_prediction", False),
                                  ("sd2-v", "v_prediction", True)):
        pipe = build_diffusers_pipeline(work / f"{name}-diffusers", tokenizer_dir, prediction,
                                        sd2=sd2)
        full = ("--full-check",) if name == "sd-v" else ()
        done = run_import(work / f"{name}-diffusers", repository / name, "--dtype", "float32",
                          *full)
        assert done.returncode == 0, done.stderr
        assert ("max diff vs diffusers" if full else "streamed") in done.stdout
        # The folders ship PNDM, which qpool has no sampler for: the import says what requests
        # get instead.
        assert "note: scheduler: PNDMScheduler (PLMS) has no qpool sampler; requests without " \
            "a scheduler get ddim" in done.stdout
        pipes[name] = pipe
    # CLIP skip: the text encoder's second-to-last layer, as diffusers' clip_skip=1; warmed up
    # at load (the images it serves are checked against diffusers like every other's).
    done = run_import(work / "sd-eps-diffusers", repository / "sd-skip", "--dtype", "float32",
                      "--clip-skip", "1", "--warmup")
    assert done.returncode == 0, done.stderr
    manifest = (repository / "sd-skip" / "pipeline.yaml").read_text()
    assert "execution:\n  warmup: true\n" in manifest
    pipes["sd-skip"] = pipes["sd-eps"]
    # Quantized at import: compared with diffusers running on the dequantized weights.
    done = run_import(work / "sd-eps-diffusers", repository / "sd-q", "--dtype", "float32",
                      "--quantize", QUANTIZED_SPEC)
    assert done.returncode == 0, done.stderr
    assert "layers quantized" in done.stdout
    pipes["sd-q"] = dequantized(build_diffusers_pipeline(work / "sd-q-diffusers", tokenizer_dir))
    # With the UNet's forward also compiled ahead of time for the CPU (Note [Compiled forward]).
    done = run_import(work / "sd-eps-diffusers", repository / "sd-compiled", "--dtype", "float32",
                      "--compile", "unet")
    assert done.returncode == 0, done.stderr
    assert "compiled for cpu" in done.stdout
    pipes["sd-compiled"] = pipes["sd-eps"]
    # Quantized and compiled: the package calls qpool's quantized linear op.
    done = run_import(work / "sd-eps-diffusers", repository / "sd-q-compiled", "--dtype",
                      "float32", "--quantize", QUANTIZED_SPEC, "--compile", "unet")
    assert done.returncode == 0, done.stderr
    assert "compiled for cpu" in done.stdout
    pipes["sd-q-compiled"] = pipes["sd-q"]
    # W8A8 with SmoothQuant scales from the components' example inputs.
    # Each quantized layer's own error against its float layer, written with --layer-error.
    layers_json = work / "sd-w8a8-layer-error.json"
    done = run_import(work / "sd-eps-diffusers", repository / "sd-w8a8", "--dtype", "float32",
                      "--quantize", "unet=w8a8,text_encoder=w8a8", "--smoothquant", "0.5",
                      "--layer-error", str(layers_json))
    assert done.returncode == 0, done.stderr
    errors = json.loads(layers_json.read_text())
    assert set(errors) == {"unet", "text_encoder"}
    for component, layers in errors.items():
        assert layers, component
        for name, e in layers.items():
            assert e["format"] == "w8a8" and 0 < e["relative_error"] < 0.1, (component, name, e)
            assert e["cosine"] > 0.99, (component, name, e)
    assert "relative error" in done.stdout
    pipes["sd-w8a8"] = pipes["sd-eps"]
    # A folder whose scheduler is DPM-Solver++ with Karras sigmas: its default sampler.
    dpm_src = work / "sd-dpm-diffusers"
    shutil.copytree(work / "sd-eps-diffusers", dpm_src)
    with_scheduler(dpm_src, "DPMSolverMultistepScheduler", use_karras_sigmas=True)
    done = run_import(dpm_src, repository / "sd-dpm", "--dtype", "float32")
    assert done.returncode == 0, done.stderr
    pipes["sd-dpm"] = load_pipeline(dpm_src)
    assert type(pipes["sd-dpm"].scheduler).__name__ == "DPMSolverMultistepScheduler"
    # diffusers' DDIMScheduler with its own defaults: the last step ends on alpha 1, and x0 would
    # be clipped but for StableDiffusionPipeline, which turns clip_sample off as it loads.
    ddim_src = work / "sd-ddim-diffusers"
    shutil.copytree(work / "sd-eps-diffusers", ddim_src)
    with_scheduler(ddim_src, "DDIMScheduler", clip_sample=True, set_alpha_to_one=True,
                   clip_sample_range=1.5)
    done = run_import(ddim_src, repository / "sd-ddim", "--dtype", "float32")
    assert done.returncode == 0, done.stderr
    pipes["sd-ddim"] = load_pipeline(ddim_src)
    return pipes, repository


def with_scheduler(src, cls_name, **changes):
    """Replaces the scheduler of the diffusers folder `src` by `cls_name` made from its config,
    as a user's folder would ship it."""
    import diffusers as d

    folder = pathlib.Path(src) / "scheduler"
    config = json.loads((folder / "scheduler_config.json").read_text())
    getattr(d, cls_name).from_config(config, **changes).save_config(folder)
    index = json.loads((pathlib.Path(src) / "model_index.json").read_text())
    index["scheduler"] = ["diffusers", cls_name]
    (pathlib.Path(src) / "model_index.json").write_text(json.dumps(index))


def load_pipeline(src):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(src, safety_checker=None)
    pipe.set_progress_bar_config(disable=True)
    return pipe


QUANTIZED_SPEC = "unet=nf4,text_encoder=int8"


def dequantized(pipe):
    """`pipe` with the weight of every linear layer of its UNet (NF4, blocksize 64) and text
    encoder (int8) replaced by what qpool's quantized layers compute with: the same bytes
    dequantized (qpool_export.quant, the Python reference of the server's op)."""
    sys.path.insert(0, str(EXPORTER))
    from qpool_export import quant

    for component, fmt in (("unet", "nf4"), ("text_encoder", "int8")):
        for layer in getattr(pipe, component).modules():
            if isinstance(layer, torch.nn.Linear):
                state = quant.quantize(layer.weight.data, fmt, blocksize=64)
                layer.weight.data = quant.dequantize(state)
    return pipe


@pytest.fixture(scope="module")
def client(make_server, imported):
    _, repository = imported

    def setup(models):
        for folder in repository.iterdir():
            shutil.copytree(folder, models / folder.name)

    return make_server(pipelines=(), load="all", setup=setup)


def latents_for(seed):
    """The noise qpool draws for image 0 of a request with `seed` (a CPU generator seeded with
    it), which diffusers gets as its initial latents."""
    return torch.randn((1, 4, SIZE // 2, SIZE // 2), generator=torch.Generator().manual_seed(seed))


def clip_skip_embeddings(pipe, texts, skip):
    """diffusers' clip_skip: layer -(skip + 1) of the text encoder, then its final layer norm
    (computed here: diffusers 0.42 reaches the norm as text_encoder.text_model, which
    transformers 5 no longer has)."""
    ids = pipe.tokenizer(texts, padding="max_length", max_length=77, truncation=True,
                         return_tensors="pt").input_ids
    encoder = pipe.text_encoder
    hidden = encoder(ids, output_hidden_states=True).hidden_states[-(skip + 1)]
    return getattr(encoder, "text_model", encoder).final_layer_norm(hidden)


# Samplers that add fresh noise each step, drawn from each image's generator after its latents.
STOCHASTIC = ("euler_a", "dpmpp_2m_sde", "dpmpp_2m_sde_karras")


def diffusers_image(pipe, scheduler, steps, seed, prompt, clip_skip=None):
    """`pipe`'s image with the scheduler of qpool's sampler `scheduler` made from its own config,
    or with None its own scheduler."""
    from diffusers import DDIMScheduler, DPMSolverMultistepScheduler, EulerDiscreteScheduler
    from diffusers import EulerAncestralDiscreteScheduler, UniPCMultistepScheduler

    # The folder's own config: one made from another class's config carries that class's
    # settings (a DPM-Solver's use_karras_sigmas would reach Euler).
    if not hasattr(pipe, "qpool_source_scheduler"):
        pipe.qpool_source_scheduler = pipe.scheduler
    pipe.scheduler = pipe.qpool_source_scheduler
    if scheduler is not None:
        cls, extra = {"ddim": (DDIMScheduler, {}), "euler": (EulerDiscreteScheduler, {}),
                      "euler_a": (EulerAncestralDiscreteScheduler, {}),
                      "dpmpp_2m": (DPMSolverMultistepScheduler, {"use_karras_sigmas": False}),
                      "dpmpp_2m_karras": (DPMSolverMultistepScheduler,
                                          {"use_karras_sigmas": True}),
                      "dpmpp_2m_sde_karras": (DPMSolverMultistepScheduler,
                                              {"use_karras_sigmas": True,
                                               "algorithm_type": "sde-dpmsolver++"}),
                      "unipc": (UniPCMultistepScheduler, {"use_karras_sigmas": False})}[scheduler]
        # qpool's DDIM neither clips x0 nor ends on alpha 1, as the imported config says.
        pipe.scheduler = cls.from_config(pipe.scheduler.config, clip_sample=False, **extra)
    with torch.no_grad():
        if clip_skip:
            embeds = {"prompt_embeds": clip_skip_embeddings(pipe, [prompt], clip_skip),
                      "negative_prompt_embeds": clip_skip_embeddings(pipe, [""], clip_skip)}
        else:
            embeds = {"prompt": prompt}
        # An ancestral sampler's step noise continues the generator of the initial latents, as
        # qpool's per-image generator does: diffusers draws both from `generator`.
        noise = ({"generator": torch.Generator().manual_seed(seed)} if scheduler in STOCHASTIC
                 else {"latents": latents_for(seed)})
        out = pipe(**embeds, height=SIZE, width=SIZE, num_inference_steps=steps,
                   guidance_scale=7.5, output_type="np", **noise)
    return np.round(out.images[0] * 255).astype(np.int16)


def qpool_image(client, name, scheduler, steps, seed, prompt):
    result = client.generate_one(pipeline=name, prompt=prompt, steps=steps, guidance_scale=7.5,
                                 width=SIZE, height=SIZE, seed=seed, scheduler=scheduler)
    png = read_png(result.images[0].png)
    assert (png.width, png.height, png.channels) == (SIZE, SIZE, 3)
    pixels = np.frombuffer(b"".join(png.rows), dtype=np.uint8).reshape(SIZE, SIZE, 3)
    return pixels.astype(np.int16)


def test_imported_pipelines_are_listed_with_their_scheduler(client, imported):
    pipelines = client.pipelines()
    for name in ("sd-eps", "sd-v", "sd2-v", "sd-q"):
        assert pipelines[name].kind == "sd"
        assert pipelines[name].state == client.pb2.PIPELINE_STATE_LOADED, pipelines[name]
    quantization = {c.name: c.quantization for c in pipelines["sd-q"].components}
    assert quantization == {"text_encoder": "int8", "unet": "nf4", "vae_decoder": "none"}


@pytest.mark.parametrize("name", ["sd-eps", "sd2-v"])
def test_prompt_embeddings_match_diffusers(client, imported, name):
    pipes, _ = imported
    prompts = ["a red fox in the snow", "", "A photo of an astronaut, riding a horse!"]
    reply = client.inference.Encode(
        client.pb2.EncodeRequest(pipeline=name, prompts=prompts), timeout=60)
    got = np.frombuffer(reply.embeddings.data, dtype=np.float32).reshape(tuple(reply.embeddings.shape))
    ids = np.frombuffer(reply.input_ids.data, dtype=np.int64).reshape(tuple(reply.input_ids.shape))
    pipe = pipes[name]
    tokens = pipe.tokenizer(prompts, padding="max_length", max_length=77, truncation=True,
                            return_tensors="pt").input_ids
    mismatch = np.argwhere(ids != tokens.numpy())
    assert len(mismatch) == 0, [(tuple(i), ids[tuple(i)], tokens.numpy()[tuple(i)]) for i in mismatch[:5]]
    with torch.no_grad():
        want = pipe.text_encoder(tokens).last_hidden_state.numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-5


@pytest.mark.parametrize("name", ["sd-eps", "sd-v", "sd2-v", "sd-q"])
@pytest.mark.parametrize("scheduler", ["ddim", "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_karras",
                                       "dpmpp_2m_sde_karras", "unipc"])
@pytest.mark.parametrize("steps", [1, 4])
def test_images_match_diffusers(client, imported, name, scheduler, steps):
    pipes, _ = imported
    prompt = "a red fox in the snow"
    want = diffusers_image(pipes[name], scheduler, steps, seed=11, prompt=prompt)
    got = qpool_image(client, name, scheduler, steps, seed=11, prompt=prompt)
    diff = np.abs(got - want)
    assert diff.max() <= 1, f"max {diff.max()} levels, mean {diff.mean():.3f}"
    # The images are not trivially equal: another seed gives another image.
    other = qpool_image(client, name, scheduler, steps, seed=12, prompt=prompt)
    assert np.abs(other - want).max() > 1


def test_smoothquant_w8a8_import_stays_close_to_diffusers(client, imported):
    """--quantize unet=w8a8,text_encoder=w8a8 --smoothquant 0.5: the layers carry calibrated
    activation scales or have them folded into the layers before them (ones then; Note [Folded
    smoothing]), the layers that read the text keep theirs, and the served image stays
    within W8A8's error of diffusers' float32 image (PSNR; on the CPU tiny pipelines give about
    50 dB)."""
    pipes, repository = imported
    unet = load_component(repository / "sd-w8a8" / "unet.pt")
    scales = [t for name, t in unet.named_buffers() if name.endswith(".code")]
    assert scales and all(t.dtype == torch.float32 and t.dim() == 1 for t in scales)
    assert any(not torch.equal(t, torch.ones_like(t)) for t in scales)
    assert any(torch.equal(t, torch.ones_like(t)) for t in scales)
    formats = {c.name: c.quantization for c in client.pipelines()["sd-w8a8"].components}
    assert formats == {"text_encoder": "w8a8", "unet": "w8a8", "vae_decoder": "none"}
    want = diffusers_image(pipes["sd-w8a8"], "ddim", 4, seed=11, prompt="a red fox in the snow")
    got = qpool_image(client, "sd-w8a8", "ddim", 4, seed=11, prompt="a red fox in the snow")
    mse = float(np.mean((got.astype(np.float64) - want) ** 2))
    assert mse > 0, "w8a8 gave float32's exact image: were the layers quantized?"
    assert 10 * np.log10(255 ** 2 / mse) > 35


def test_default_sampler_of_a_dpm_solver_folder_matches_diffusers(client, imported):
    """A folder shipping DPMSolverMultistepScheduler(use_karras_sigmas=True) is served with
    dpmpp_2m_karras by default, and a request that names no scheduler gets the image diffusers'
    pipeline gives with its own scheduler; over 6 steps the second-order updates count."""
    pipes, _ = imported
    assert "dpmpp_2m_karras" in client.pipelines()["sd-dpm"].schedulers
    prompt = "a red fox in the snow"
    want = diffusers_image(pipes["sd-dpm"], None, 6, seed=5, prompt=prompt)
    got = qpool_image(client, "sd-dpm", "", 6, seed=5, prompt=prompt)
    assert np.abs(got - want).max() <= 1
    # Another sampler gives another image: the default is what matched.
    other = qpool_image(client, "sd-dpm", "dpmpp_2m", 6, seed=5, prompt=prompt)
    assert np.abs(other - want).max() > 1


def test_ddim_with_diffusers_defaults_ends_on_alpha_one_as_diffusers(client, imported):
    """DDIMScheduler() as diffusers makes it (clip_sample, set_alpha_to_one) serves the image
    StableDiffusionPipeline makes with it: ending on alpha 1, without the clipping that pipeline
    turns off."""
    pipes, repository = imported
    scheduler = (repository / "sd-ddim" / "pipeline.yaml").read_text().split("scheduler:")[1]
    assert "set_alpha_to_one: true" in scheduler and "clip_sample: false" in scheduler
    prompt = "a red fox in the snow"
    want = diffusers_image(pipes["sd-ddim"], None, 4, seed=3, prompt=prompt)
    got = qpool_image(client, "sd-ddim", "", 4, seed=3, prompt=prompt)
    assert np.abs(got - want).max() <= 1


def test_compiled_unet_matches_diffusers(client, imported):
    """--compile unet: the server runs the UNet's AOTInductor package, whose generated kernels
    round differently from TorchScript's ops (a level or two of 255 over a few steps)."""
    pipes, repository = imported
    text = (repository / "sd-compiled" / "pipeline.yaml").read_text()
    assert "file: unet.cpu.pt2" in text and "device: cpu" in text
    prompt = "a red fox in the snow"
    want = diffusers_image(pipes["sd-compiled"], "ddim", 4, seed=11, prompt=prompt)
    got = qpool_image(client, "sd-compiled", "ddim", 4, seed=11, prompt=prompt)
    assert np.abs(got - want).max() <= 3
    log = client.server.stderr_text() + "\n".join(client.server.stdout_lines)
    assert "compiled forward" in log, "the package was not attached"


def test_quantized_compiled_unet_matches_diffusers(client, imported):
    """--quantize unet=nf4 --compile unet: the package reads the NF4 weights and quant state in
    the dtypes the server keeps them in and calls qpool's quantized linear op for every linear
    layer, so it serves diffusers' image on the dequantized weights as the TorchScript UNet
    does, within the compiled kernels' rounding."""
    pipes, repository = imported
    text = (repository / "sd-q-compiled" / "pipeline.yaml").read_text()
    assert "file: unet.cpu.pt2" in text
    prompt = "a red fox in the snow"
    want = diffusers_image(pipes["sd-q-compiled"], "ddim", 4, seed=11, prompt=prompt)
    got = qpool_image(client, "sd-q-compiled", "ddim", 4, seed=11, prompt=prompt)
    assert np.abs(got - want).max() <= 3
    plain = qpool_image(client, "sd-q", "ddim", 4, seed=11, prompt=prompt)
    assert np.abs(got - plain).max() <= 3
    paths = {}
    for (name, labels), value in parse_samples(scrape(client)).items():
        labels = dict(labels)
        if (name == "qpool_component_forwards_total" and labels["pipeline"] == "sd-q-compiled"
                and labels["component"] == "unet"):
            paths[labels["path"]] = value
    assert paths["compiled"] >= 4 and paths["torchscript"] == 0


def test_clip_skip_matches_diffusers(client, imported):
    pipes, _ = imported
    prompt = "a red fox in the snow"
    want = diffusers_image(pipes["sd-eps"], "ddim", 4, seed=3, prompt=prompt, clip_skip=1)
    got = qpool_image(client, "sd-skip", "ddim", 4, seed=3, prompt=prompt)
    assert np.abs(got - want).max() <= 1
    # ... and it is another image than without the skip.
    assert np.abs(qpool_image(client, "sd-eps", "ddim", 4, seed=3, prompt=prompt) - want).max() > 1


# ------------------------------------------------------------------ what the importer refuses


@pytest.fixture(scope="module")
def good_source(tmp_path_factory, source_repository):
    work = tmp_path_factory.mktemp("sources")
    src = work / "sd"
    build_diffusers_pipeline(src, pathlib.Path(source_repository) / "tiny" / "tokenizer")
    return src


def broken_copy(good_source, tmp_path, edit):
    src = tmp_path / "broken"
    shutil.copytree(good_source, src)
    edit(src)
    return src


def edit_json(path, **changes):
    value = json.loads(path.read_text())
    value.update(changes)
    path.write_text(json.dumps(value))


CASES = {
    "missing component folder": (lambda s: shutil.rmtree(s / "vae"), "vae: missing"),
    "unknown pipeline class": (
        lambda s: edit_json(s / "model_index.json", _class_name="StableDiffusion3Pipeline"),
        "field '_class_name' is 'StableDiffusion3Pipeline'"),
    "unknown component class": (
        lambda s: edit_json(s / "model_index.json", unet=["diffusers", "UNet2DModel"]),
        "field 'unet' names class 'UNet2DModel'"),
    "unsupported scheduler option": (
        lambda s: edit_json(s / "scheduler" / "scheduler_config.json",
                            rescale_betas_zero_snr=True),
        "field 'rescale_betas_zero_snr' is True"),
    "unsupported scheduler schedule": (
        lambda s: edit_json(s / "scheduler" / "scheduler_config.json",
                            beta_schedule="squaredcos_cap_v2"),
        "field 'beta_schedule' is 'squaredcos_cap_v2'"),
    "DPM-Solver of order 3": (
        lambda s: edit_json(s / "scheduler" / "scheduler_config.json",
                            _class_name="DPMSolverMultistepScheduler", solver_order=3),
        "field 'solver_order' is 3; qpool's dpmpp_2m computes 2"),
    "DPM-Solver of the noise": (
        lambda s: edit_json(s / "scheduler" / "scheduler_config.json",
                            _class_name="DPMSolverMultistepScheduler", algorithm_type="dpmsolver",
                            final_sigmas_type="sigma_min"),
        "field 'algorithm_type' is 'dpmsolver'"),
    "weights that do not match the config": (
        lambda s: edit_json(s / "unet" / "config.json", block_out_channels=[32, 96]),
        "the architecture its config describes needs [96, 32, 3, 3]"),
    "truncated safetensors": (
        lambda s: (s / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(
            (s / "unet" / "diffusion_pytorch_model.safetensors").read_bytes()[:5000]),
        "unet/diffusion_pytorch_model.safetensors: cannot be read as safetensors"),
    "weights that do not match the config, full check": (
        lambda s: edit_json(s / "unet" / "config.json", block_out_channels=[32, 96]),
        "unet: cannot be loaded", "--full-check"),
    "truncated safetensors, full check": (
        lambda s: (s / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(
            (s / "unet" / "diffusion_pytorch_model.safetensors").read_bytes()[:5000]),
        "unet: cannot be loaded", "--full-check"),
    "unsupported architecture field": (
        lambda s: edit_json(s / "unet" / "config.json", only_cross_attention=True),
        "field 'only_cross_attention' is True"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_failures_name_the_problem_and_leave_the_repository_untouched(
        good_source, tmp_path, case):
    edit, message, *args = CASES[case]
    src = broken_copy(good_source, tmp_path, edit)
    repository = tmp_path / "repo"
    repository.mkdir()
    (repository / "keep.txt").write_text("x")
    done = run_import(src, repository / "model", "--dtype", "float32", *args)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in repository.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("args,message", [
    (("--min-weights", "-1"), "--min-weights must be in [0, 2^31) (got -1)"),
    (("--min-weights", "4096"), "--min-weights applies to components named by --quantize"),
    (("--quantize", "unet=w8a8", "--min-weights", "x"), "--min-weights: invalid int value"),
])
def test_bad_options_are_refused_before_anything_is_written(good_source, tmp_path, args, message):
    repository = tmp_path / "repo"
    repository.mkdir()
    done = run_import(good_source, repository / "model", *args)
    assert done.returncode == 2
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert list(repository.iterdir()) == []


@pytest.mark.parametrize("quantize", ["none", "text_encoder=int8,unet=nf4,vae_decoder=w8a8"])
def test_a_streamed_import_writes_the_tensors_of_a_full_one(good_source, tmp_path, quantize):
    """Note [Streaming import]: each component read block by block from its files (in blocks
    of 1 MiB, so that the UNet is cut into its blocks) is, tensor for tensor and byte for byte,
    the component loaded whole by diffusers, checked against it and saved; quantized ones
    included, whose weight errors the report names."""
    sys.path.insert(0, str(EXPORTER))
    from qpool_export import weights_file

    args = ["--dtype", "float16"] + (["--quantize", quantize] if quantize != "none" else [])
    streamed = run_import(good_source, tmp_path / "streamed", *args, "--max-block-mib", "1")
    full = run_import(good_source, tmp_path / "full", *args, "--full-check")
    assert streamed.returncode == 0 and full.returncode == 0, streamed.stderr + full.stderr
    assert "max diff vs diffusers" not in streamed.stdout and "streamed" in streamed.stdout
    if quantize != "none":
        assert "largest weight error of a quantized layer" in streamed.stdout, streamed.stdout
    for component in ("text_encoder", "unet", "vae_decoder"):
        want = weights_file.read_weights(str(tmp_path / "full" / f"{component}.safetensors"))
        got = weights_file.read_weights(str(tmp_path / "streamed" / f"{component}.safetensors"))
        assert sorted(got) == sorted(want), component
        for name, tensor in want.items():
            assert got[name].dtype == tensor.dtype, (component, name)
            assert torch.equal(got[name], tensor), (component, name)
    # The graphs name the same slots; the server loads both (test_images_match_diffusers).
    for component in ("text_encoder", "unet", "vae_decoder"):
        a = weights_file.load_component(str(tmp_path / "streamed" / f"{component}.pt"))
        b = weights_file.load_component(str(tmp_path / "full" / f"{component}.pt"))
        assert sorted(weights_file.tensor_slots(a)) == sorted(weights_file.tensor_slots(b))
