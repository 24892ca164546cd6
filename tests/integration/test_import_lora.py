"""LoRA files fused at import (Note [Fused LoRAs] in tools/qpool_export/qpool_export/lora_fuse.py):
a tiny SD pipeline with random weights (test_import_diffusers' builder), LoRAs for its UNet and
text encoder made here with PEFT (random, non-zero updates) and saved as diffusers saves LoRAs,
imported with `--lora FILE:SCALE`, served by the real server and compared with diffusers running
the same LoRAs unfused (PEFT's layers at those scales) on the same weights and initial latents:
float32 on the CPU, images within one 8-bit level; the same for an SDXL LoRA of the UNet and both
text encoders. Then what the importer refuses, leaving the repository as it was.
"""

import copy
import pathlib

import pytest

diffusers = pytest.importorskip("diffusers")
torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("peft")

import test_import_diffusers as sd_tests  # noqa: E402 - after the skips

PROMPT = "a red fox in the snow"


def make_lora(pipe, out, seed, encoders=("text_encoder",)):
    """A LoRA of rank 4 for `pipe`'s UNet attention and the attention of its text `encoders`,
    with random A and B, saved to out/pytorch_lora_weights.safetensors by the pipeline class's
    save_lora_weights."""
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig, inject_adapter_in_model
    from peft.utils import get_peft_model_state_dict

    def adapted(module, alpha, targets):
        module = inject_adapter_in_model(
            LoraConfig(r=4, lora_alpha=alpha, init_lora_weights=False, target_modules=targets),
            copy.deepcopy(module))
        # Updates a few times larger than PEFT's initialisation gives: LoRAs that change the
        # image by tens of levels, so that a scale applied wrongly cannot pass for rounding.
        return {k: v * 4 if "lora_B" in k or "lora.up" in k else v
                for k, v in convert_state_dict_to_diffusers(
                    get_peft_model_state_dict(module)).items()}

    torch.manual_seed(seed)
    layers = {"unet_lora_layers": adapted(pipe.unet, 4, ["to_q", "to_k", "to_v", "to_out.0"])}
    for encoder in encoders:
        layers[f"{encoder}_lora_layers"] = adapted(getattr(pipe, encoder), 2,
                                                   ["q_proj", "k_proj", "v_proj", "out_proj"])
    type(pipe).save_lora_weights(out, safe_serialization=True, **layers)
    return pathlib.Path(out) / "pytorch_lora_weights.safetensors"


@pytest.fixture(scope="module")
def source(tmp_path_factory, source_repository):
    """(the diffusers folder, its pipeline, two LoRA files: UNet + text encoder, UNet only)."""
    work = tmp_path_factory.mktemp("lora")
    tokenizer_dir = pathlib.Path(source_repository) / "tiny" / "tokenizer"
    pipe = sd_tests.build_diffusers_pipeline(work / "sd", tokenizer_dir)
    loras = (make_lora(pipe, work / "a", seed=1), make_lora(pipe, work / "b", seed=2,
                                                            encoders=()))
    return work / "sd", pipe, loras


IMPORTS = {  # served name -> the LoRAs and scales fused into it
    "sd-base": (),
    "sd-lora": ((0, 0.7),),
    "sd-two-loras": ((0, 0.7), (1, -0.4)),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory, source):
    src, _, loras = source
    repository = tmp_path_factory.mktemp("repo")
    for name, fused in IMPORTS.items():
        args = [f"--lora={loras[i]}:{scale}" for i, scale in fused]
        done = sd_tests.run_import(src, repository / name, "--dtype", "float32", *args)
        assert done.returncode == 0, done.stderr
        if fused:
            assert "into text_encoder, unet" in done.stdout, done.stdout
            header = (repository / name / "pipeline.yaml").read_text()
            assert "fused LoRA pytorch_lora_weights.safetensors x 0.7 (sha256 " in header
    # Nothing of the fusing is left beside the pipelines.
    assert sorted(p.name for p in repository.iterdir()) == sorted(IMPORTS)
    return repository


@pytest.fixture(scope="module")
def client(make_server, imported):
    def setup(models):
        import shutil

        for name in IMPORTS:
            shutil.copytree(imported / name, models / name)

    return make_server(pipelines=(), load="all", setup=setup)


def reference(src, loras, fused):
    """diffusers' pipeline of `src` with `fused` LoRAs loaded as PEFT adapters (not fused) at
    their scales."""
    pipe = sd_tests.load_pipeline(src)
    names = []
    for i, _ in fused:
        pipe.load_lora_weights(str(loras[i]), adapter_name=f"lora{i}")
        names.append(f"lora{i}")
    if names:
        pipe.set_adapters(names, adapter_weights=[scale for _, scale in fused])
    return pipe


@pytest.mark.parametrize("name", list(IMPORTS))
@pytest.mark.parametrize("scheduler", ["ddim", "euler_a"])
def test_served_images_match_diffusers_with_the_lora(client, source, name, scheduler):
    src, _, loras = source
    pipe = reference(src, loras, IMPORTS[name])
    want = sd_tests.diffusers_image(pipe, scheduler, 4, seed=11, prompt=PROMPT)
    got = sd_tests.qpool_image(client, name, scheduler, 4, seed=11, prompt=PROMPT)
    diff = np.abs(got - want)
    assert diff.max() <= 1, f"max {diff.max()} levels, mean {diff.mean():.3f}"
    assert want.std() > 5, "a flat reference image compares nothing"


def test_a_lora_changes_the_image(client):
    images = {name: sd_tests.qpool_image(client, name, "ddim", 4, seed=3, prompt=PROMPT)
              for name in IMPORTS}
    assert np.abs(images["sd-lora"] - images["sd-base"]).max() > 16
    assert np.abs(images["sd-two-loras"] - images["sd-lora"]).max() > 16


def foreign_lora(lora, tmp_path):
    """`lora` as if made for another model: its keys name blocks this pipeline does not have."""
    from safetensors.torch import load_file, save_file

    renamed = {k.replace("down_blocks", "side_blocks").replace("up_blocks", "top_blocks")
               .replace("mid_block", "core_block").replace("text_model", "other_model"): v
               for k, v in load_file(str(lora)).items()}
    path = tmp_path / "foreign.safetensors"
    save_file(renamed, str(path))
    return path


@pytest.mark.parametrize("case", ["missing file", "not safetensors", "for another model",
                                  "bad scale"])
def test_refused_loras_leave_the_repository_untouched(source, source_repository, tmp_path, case):
    src, _, loras = source
    repository = tmp_path / "repo"
    repository.mkdir()
    if case == "missing file":
        arg, message = f"--lora={tmp_path / 'nope.safetensors'}", "not a file"
    elif case == "not safetensors":
        path = tmp_path / "lora.bin"
        path.write_bytes(b"\0" * 64)
        arg, message = f"--lora={path}", "from .safetensors files"
    elif case == "for another model":
        path = foreign_lora(loras[0], tmp_path)
        arg, message = f"--lora={path}", f"--lora {path}: "
    else:
        arg, message = f"--lora={loras[0]}:inf", "finite number"
    done = sd_tests.run_import(src, repository / "sd", "--dtype", "float32", arg)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert list(repository.iterdir()) == [], "the failed import left files behind"


def test_the_scale_is_the_one_asked_for(client, source):
    """sd-lora (scale 0.7) is not diffusers' image at the LoRA's full scale."""
    src, _, loras = source
    full = sd_tests.diffusers_image(reference(src, loras, ((0, 1.0),)), "ddim", 4, seed=11,
                                    prompt=PROMPT)
    got = sd_tests.qpool_image(client, "sd-lora", "ddim", 4, seed=11, prompt=PROMPT)
    assert np.abs(got - full).max() > 4


# ------------------------------------------------------------------ SDXL


@pytest.fixture(scope="module")
def sdxl(tmp_path_factory, source_repository, make_server):
    """(a client serving sdxl and sdxl-lora, a LoRA for the UNet and both text encoders fused at
    0.8, and diffusers' pipeline running that LoRA unfused through PEFT)."""
    import shutil

    import test_import_sdxl as sdxl_tests

    work = tmp_path_factory.mktemp("sdxl-lora")
    src = work / "sdxl-diffusers"
    pipe = sdxl_tests.build_sdxl_pipeline(src, pathlib.Path(source_repository) / "tiny" /
                                          "tokenizer")
    lora = make_lora(pipe, work / "lora", seed=3, encoders=("text_encoder", "text_encoder_2"))
    repository = work / "repo"
    sdxl_tests.imported_into(repository, "sdxl", src, "--dtype", "float32")
    sdxl_tests.imported_into(repository, "sdxl-lora", src, "--dtype", "float32",
                             f"--lora={lora}:0.8")
    reference = sdxl_tests.load_pipeline(src)
    reference.load_lora_weights(str(lora), adapter_name="style")
    reference.set_adapters(["style"], adapter_weights=[0.8])

    def setup(models):
        for name in ("sdxl", "sdxl-lora"):
            shutil.copytree(repository / name, models / name)

    return make_server(pipelines=(), load="all", setup=setup), reference


def test_fused_sdxl_lora_matches_diffusers(sdxl):
    """sdxl-lora equals StableDiffusionXLPipeline running the LoRA unfused at the same scale,
    and changes the image."""
    import test_import_sdxl as sdxl_tests

    client, reference = sdxl
    for request in (dict(scheduler="euler"),
                    dict(scheduler="dpmpp_2m_karras", negative_prompt="blurry, low quality")):
        request.update(steps=4, prompt=PROMPT)
        want = sdxl_tests.diffusers_image(reference, seed=11, **request)
        got = sdxl_tests.qpool_image(client, "sdxl-lora", seed=11, **request)
        assert np.abs(got - want).max() <= 1, request
        assert np.abs(sdxl_tests.qpool_image(client, "sdxl", seed=11, **request) - got).max() > 8
