"""Single-file checkpoints: small SD 1.x, SD 2.x (v-prediction), SDXL and FLUX.1-dev pipelines
built here with random weights, written as users' files hold them (single_file_writer.py: one
AUTOMATIC1111-layout checkpoint for SD; for FLUX a Black Forest Labs transformer, in float32 and
in float8_e4m3fn, with CLIP-L, T5 and VAE files beside it), imported with `qpool_export
from-single-file FILE --config FOLDER` and compared with what diffusers' own `from_single_file`
reads from the same files (with `config=` the same folder).

Without a server: each imported component is, tensor for tensor and byte for byte, the import
of the pipeline diffusers' from_single_file loads (saved and imported with from-diffusers, whose
images test_import_diffusers.py and its peers compare with diffusers'), and the manifests agree
but for their header; refusals name the file and leave the repository untouched.

With the server (tests named `served`): images against diffusers' from_single_file pipeline on
the same initial latents, within one 8-bit level (float32 on the CPU, as the folder tests).

diffusers' FLUX converter fixes the transformer's width at FLUX.1's 3072: the tests run it with
that constant set to the small model's (flux_converter).
"""

import contextlib
import shutil

import pytest

diffusers = pytest.importorskip("diffusers")
torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
safetensors = pytest.importorskip("safetensors.torch")

import single_file_writer as writer  # noqa: E402 - after the skips
import test_import_diffusers as sd_tests  # noqa: E402
import test_import_flux as flux_tests  # noqa: E402
import test_import_sdxl as sdxl_tests  # noqa: E402

EXPORTER = sd_tests.EXPORTER
PROMPT = "a red fox in the snow"


one_thread = sdxl_tests.one_thread  # the diffusers references run on one thread too


def run_single_file(checkpoint, out, *args):
    """`qpool_export from-single-file CHECKPOINT --out OUT ARGS` in this process, as
    test_import_diffusers.run_import runs from-diffusers."""
    return sd_tests.run_import(checkpoint, out, *args, command="from-single-file")


@contextlib.contextmanager
def flux_converter(transformer_config):
    """diffusers' FLUX single-file converter with its width constant (3072, FLUX.1's) set to the
    small model's."""
    from unittest import mock

    import diffusers.loaders.single_file_model as model
    import diffusers.loaders.single_file_utils as utils

    fn = utils.convert_flux_transformer_checkpoint_to_diffusers
    width = transformer_config.num_attention_heads * transformer_config.attention_head_dim
    code = fn.__code__.replace(co_consts=tuple(width if c == 3072 else c
                                               for c in fn.__code__.co_consts))
    patched = type(fn)(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    entries = [v for v in model.SINGLE_FILE_LOADABLE_CLASSES.values()
               if v.get("checkpoint_mapping_fn") is fn]
    assert entries, "diffusers' FLUX converter is no longer where the test looks"
    with contextlib.ExitStack() as stack:
        for entry in entries:
            stack.enter_context(mock.patch.dict(entry, checkpoint_mapping_fn=patched))
        yield


def save(tensors, path):
    safetensors.save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def sd_case(work, tokenizer_dir, family):
    """(the checkpoint, the diffusers folder of its configs, diffusers' from_single_file pipeline)."""
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    folder = work / f"{family}-diffusers"
    if family == "sdxl":
        # Two encoders of different widths, as SDXL's (768, 1280): diffusers tells them apart so.
        pipe = sdxl_tests.build_sdxl_pipeline(folder, tokenizer_dir, hidden_2=48)
        cls, extra = StableDiffusionXLPipeline, {}
    else:
        pipe = sd_tests.build_diffusers_pipeline(
            folder, tokenizer_dir, "v_prediction" if family == "sd2" else "epsilon",
            sd2=family == "sd2")
        cls, extra = StableDiffusionPipeline, {"safety_checker": None}
    checkpoint = save(writer.sd_checkpoint(pipe, family), work / f"{family}.safetensors")
    reference = cls.from_single_file(str(checkpoint), config=str(folder), local_files_only=True,
                                     **extra)
    return checkpoint, folder, reference


def flux_case(work, tokenizer_files, fp8):
    """(the transformer file, the folder, from_single_file's pipeline, the other files' flags)."""
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel

    name = "flux-fp8" if fp8 else "flux"
    folder = work / f"{name}-diffusers"
    pipe = flux_tests.build_flux_pipeline(folder, tokenizer_files, True)
    transformer = writer.bfl_flux(pipe.transformer)
    if fp8:  # ComfyUI's fp8 files: the matrices in float8_e4m3fn, the rest as it was
        transformer = {k: v.to(torch.float8_e4m3fn) if v.dim() == 2 else v
                       for k, v in transformer.items()}
    checkpoint = save(transformer, work / f"{name}.safetensors")
    files = {"--vae": save(writer.ldm_vae(pipe.vae, ""), work / f"{name}-ae.safetensors"),
             "--clip-l": save(writer.hf_clip(pipe.text_encoder, ""),
                              work / f"{name}-clip_l.safetensors"),
             # T5 files hold the tied embedding once, as shared.weight.
             "--t5": save({k: v for k, v in pipe.text_encoder_2.state_dict().items()
                           if k != "encoder.embed_tokens.weight"},
                          work / f"{name}-t5xxl.safetensors")}
    with flux_converter(pipe.transformer.config):
        model = FluxTransformer2DModel.from_single_file(
            str(checkpoint), config=str(folder), subfolder="transformer", local_files_only=True,
            torch_dtype=torch.float32)
    vae = AutoencoderKL.from_single_file(str(files["--vae"]), config=str(folder), subfolder="vae",
                                         local_files_only=True)
    reference = FluxPipeline.from_pretrained(str(folder), transformer=model, vae=vae)
    args = [a for flag, path in files.items() for a in (flag, str(path))]
    return checkpoint, folder, reference, args


@pytest.fixture(scope="module")
def imported(tmp_path_factory, tokenizer_files):
    """{name: (diffusers' from_single_file pipeline, qpool's import of the file, qpool's import
    of that pipeline saved as a folder)}."""
    work = tmp_path_factory.mktemp("single-file")
    repository = work / "repo"
    out = {}
    cases = {f: sd_case(work, tokenizer_files[0], f) + ([],) for f in ("sd1", "sd2", "sdxl")}
    cases["flux"] = flux_case(work, tokenizer_files, fp8=False)
    cases["flux-fp8"] = flux_case(work, tokenizer_files, fp8=True)
    for name, (checkpoint, folder, reference, args) in cases.items():
        done = run_single_file(checkpoint, repository / name, "--config", str(folder),
                               "--dtype", "float32", *args)
        assert done.returncode == 0, done.stderr
        assert "found " in done.stdout and "streamed" in done.stdout, done.stdout
        reference.set_progress_bar_config(disable=True)
        saved = work / f"{name}-from-single-file"
        reference.save_pretrained(saved)
        if name.startswith("flux"):  # as FLUX folders ship it
            shutil.copyfile(tokenizer_files[1], saved / "tokenizer_2" / "spiece.model")
        done = sd_tests.run_import(saved, work / "folders" / name, "--dtype", "float32")
        assert done.returncode == 0, done.stderr
        out[name] = (reference, repository / name, work / "folders" / name)
    return out


def manifest_body(folder):
    """pipeline.yaml without its header comments (which name the source)."""
    text = (folder / "pipeline.yaml").read_text()
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


@pytest.mark.parametrize("name", ["sd1", "sd2", "sdxl", "flux", "flux-fp8"])
def test_a_single_file_imports_as_diffusers_reads_it(imported, name):
    from qpool_export import weights_file

    _, single, folder = imported[name]
    files = sorted(p.name for p in folder.rglob("*") if p.is_file())
    assert sorted(p.name for p in single.rglob("*") if p.is_file()) == files
    weights = [f for f in files if f.endswith(".safetensors")]
    assert len(weights) >= 3, files
    for file in weights:
        want = weights_file.read_weights(str(folder / file))
        got = weights_file.read_weights(str(single / file))
        assert sorted(got) == sorted(want), file
        for key, tensor in want.items():
            assert got[key].dtype == tensor.dtype and torch.equal(got[key], tensor), (file, key)
    for tokenizer in folder.glob("tokenizer*/*"):
        assert (single / tokenizer.relative_to(folder)).read_bytes() == tokenizer.read_bytes()
    # The same configuration, scheduler and tokenizers; the digests are of the same bytes but
    # for the graphs' (which record where they were traced).
    strip = [line for line in manifest_body(single).splitlines() if "sha256" not in line]
    assert strip == [line for line in manifest_body(folder).splitlines()
                     if "sha256" not in line]
    header = (single / "pipeline.yaml").read_text().splitlines()[0]
    assert "from-single-file" in header, header


def snapshot(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def lora_file(path):
    return save({"lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight":
                 torch.zeros(4, 32), "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight":
                 torch.zeros(32, 4)}, path)


@pytest.fixture(scope="module")
def sd1_files(tmp_path_factory, tokenizer_files):
    work = tmp_path_factory.mktemp("sd1-files")
    pipe = sd_tests.build_diffusers_pipeline(work / "folder", tokenizer_files[0])
    return writer.sd_checkpoint(pipe, "sd1"), work / "folder"


FAILURES = {
    "a LoRA given as a checkpoint": (
        lambda state, path: lora_file(path), (), "a LoRA adapter"),
    "a truncated file": (
        lambda state, path: path.write_bytes(save(state, path).read_bytes()[:4000]), (),
        "cannot be read as safetensors"),
    "an unknown architecture": (
        lambda state, path: save({"encoder.layers.0.weight": torch.zeros(2, 2)}, path), (),
        "no architecture qpool knows"),
    "a tensor no layout maps": (
        lambda state, path: save({**state, "model.diffusion_model.input_blocks.1.0.extra.weight":
                                  torch.zeros(2)}, path), (),
        "tensor(s) of the UNet that qpool cannot map, the first: "
        "model.diffusion_model.input_blocks.1.0.extra.weight"),
    "a tensor of no component": (
        lambda state, path: save({**state, "control_model.zero_convs.0.weight": torch.zeros(2)},
                                 path), (),
        "belong to no component qpool imports, the first: control_model.zero_convs.0.weight"),
    "a missing text encoder": (
        lambda state, path: save({k: v for k, v in state.items()
                                  if not k.startswith("cond_stage_model.")}, path), (),
        "no architecture qpool knows"),
    "a bitsandbytes NF4 file": (
        lambda state, path: save({**state, "model.diffusion_model.out.2.weight.quant_state."
                                  "bitsandbytes__nf4": torch.zeros(8, dtype=torch.uint8)}, path),
        (), "a bitsandbytes-quantized checkpoint"),
    "a zero terminal SNR file": (
        lambda state, path: save({**state, "ztsnr": torch.zeros(())}, path), (),
        "trained with zero terminal SNR"),
    "no tokenizers": (lambda state, path: save(state, path), ("--no-config",),
                      "a checkpoint holds no tokenizer; give --tokenizers DIR"),
    "a file of another family than --family": (
        lambda state, path: save(state, path), ("--family", "sdxl"),
        "--family sdxl: {path} is a Stable Diffusion 1.x checkpoint"),
    "an option a single file takes not yet": (
        lambda state, path: save(state, path), ("--full-check",), "--full-check: a single-file"),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_refusals_name_the_file_and_leave_the_repository_untouched(sd1_files, tmp_path, case):
    state, folder = sd1_files
    make, args, message = FAILURES[case]
    path = tmp_path / "model.safetensors"
    make(state, path)
    repository = tmp_path / "repo"
    repository.mkdir()
    (repository / "keep.txt").write_text("x")
    config = [] if "--no-config" in args else ["--config", str(folder)]
    args = [a for a in args if a != "--no-config"]
    done = run_single_file(path, repository / "model", *config, *args)
    assert done.returncode != 0
    assert message.format(path=path) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert snapshot(repository) == ["keep.txt"]


# ------------------------------------------------------------------ served


@pytest.fixture(scope="module")
def client(make_server, imported):
    return make_server(pipelines=(), load="all",
                       folders={name: single for name, (_, single, _) in imported.items()})


def test_served_sd_images_match_diffusers_from_single_file(client, imported):
    for name in ("sd1", "sd2"):
        pipe = imported[name][0]
        want = sd_tests.diffusers_image(pipe, "ddim", 3, 5, PROMPT)
        got = sd_tests.qpool_image(client, name, "ddim", 3, 5, PROMPT)
        assert np.abs(got - want).max() <= 1, name


def test_served_sdxl_image_matches_diffusers_from_single_file(client, imported):
    pipe = imported["sdxl"][0]
    pipe.set_progress_bar_config(disable=True)
    want = sdxl_tests.diffusers_image(pipe, "euler", 3, 7, PROMPT)
    got = sdxl_tests.qpool_image(client, "sdxl", "euler", 3, 7, PROMPT)
    assert np.abs(got - want).max() <= 1


@pytest.mark.parametrize("name", ["flux", "flux-fp8"])
def test_served_flux_images_match_diffusers_from_single_file(client, imported, name):
    pipe = imported[name][0]
    want = flux_tests.diffusers_images(pipe, 3, 9, PROMPT, 3.5)
    got = flux_tests.qpool_images(client, name, 3, 9, PROMPT, 3.5)
    assert np.abs(got[0] - want[0]).max() <= 1


def test_a_file_marked_v_pred_predicts_v_unless_the_flag_says(sd1_files, tmp_path):
    """ComfyUI marks v-prediction checkpoints with a 'v_pred' tensor."""
    state, folder = sd1_files
    path = save({**state, "v_pred": torch.zeros(())}, tmp_path / "model.safetensors")
    done = run_single_file(path, tmp_path / "repo" / "v", "--config", str(folder))
    assert done.returncode == 0, done.stderr
    assert "prediction_type: v_prediction" in (tmp_path / "repo" / "v" / "pipeline.yaml").read_text()
    done = run_single_file(path, tmp_path / "repo" / "eps", "--config", str(folder),
                           "--prediction-type", "epsilon")
    assert done.returncode == 0, done.stderr
    assert "prediction_type: epsilon" in (tmp_path / "repo" / "eps" / "pipeline.yaml").read_text()
