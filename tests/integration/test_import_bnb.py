"""bitsandbytes-quantized diffusers checkpoints (Note [bitsandbytes checkpoints] in
tools/qpool_export/qpool_export/bnb_import.py): the tests write the checkpoints' bytes themselves
(NF4 with and without double quantization, LLM.int8 with SCB) with a writer and a dequantizer
written here from the published format, no CUDA needed. The import must give layers whose
dequantized weights equal the reference dequantization of the same bytes exactly, and the served
pipeline the images diffusers computes with those dequantized weights (within one 8-bit level, as
in test_import_diffusers.py); what qpool cannot hold losslessly is refused, naming the tensor.
"""

import json
import pathlib
import shutil

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("diffusers")

from test_import_diffusers import (  # noqa: E402 - after the skips
    EXPORTER, build_diffusers_pipeline, diffusers_image, qpool_image, run_import)

# The 16 NF4 values (QLoRA), as bitsandbytes publishes them and stores them in quant_map.
NF4 = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=torch.float32)
BLOCKSIZE = 32  # the tiny models' rows are 32 elements and up
NESTED = 256


def json_tensor(value):
    return torch.tensor(list(json.dumps(value).encode("utf-8")), dtype=torch.uint8)


def write_nf4(state, prefix, w, double_quant, quant_type="nf4", blocksize=BLOCKSIZE):
    """Replaces state[prefix.weight] by bitsandbytes' 4-bit tensors of `w` (blocks of
    `blocksize` consecutive elements of the flattened weight); returns the weight they stand for,
    dequantized by the format's formula."""
    n, k = w.shape
    blocks = w.detach().float().flatten().reshape(-1, blocksize)
    absmax = blocks.abs().amax(1)
    idx = (blocks / absmax[:, None]).unsqueeze(-1).sub(NF4).abs().argmin(-1).flatten()
    state[f"{prefix}.weight"] = ((idx[0::2] << 4) | idx[1::2]).to(torch.uint8).reshape(-1, 1)
    state[f"{prefix}.weight.quant_map"] = NF4.clone()
    qs = {"quant_type": quant_type, "blocksize": blocksize, "dtype": "float32", "shape": [n, k]}
    if double_quant:
        offset = absmax.mean()
        centered = absmax - offset
        nested_map = torch.linspace(-1, 1, 256)  # the checkpoint carries its own 8-bit code
        chunks = torch.split(centered, NESTED)
        nested_absmax = torch.stack([c.abs().max() for c in chunks])
        scale = nested_absmax.repeat_interleave(NESTED)[: centered.numel()]
        q = (centered / scale).unsqueeze(-1).sub(nested_map).abs().argmin(-1)
        state[f"{prefix}.weight.absmax"] = q.to(torch.uint8)
        state[f"{prefix}.weight.nested_absmax"] = nested_absmax
        state[f"{prefix}.weight.nested_quant_map"] = nested_map
        qs.update(nested_blocksize=NESTED, nested_offset=offset.item(), nested_dtype="float32")
        absmax_f = nested_map[q] * scale + torch.tensor(offset.item(), dtype=torch.float32)
    else:
        state[f"{prefix}.weight.absmax"] = absmax
        absmax_f = absmax
    state[f"{prefix}.weight.quant_state.bitsandbytes__{quant_type}"] = json_tensor(qs)
    return (NF4[idx].reshape(-1, blocksize) * absmax_f[:, None]).reshape(n, k)


def write_int8(state, prefix, w):
    """LLM.int8: int8 rows and their absmax SCB; returns weight * SCB / 127."""
    scb = w.detach().float().abs().amax(1)
    q = torch.round(w.detach().float() * 127 / scb[:, None]).clamp(-127, 127).to(torch.int8)
    state[f"{prefix}.weight"] = q
    state[f"{prefix}.SCB"] = scb
    return q.float() * (scb / 127)[:, None]


def quantize_component(folder, module, weights_file, config_extra, write):
    """Rewrites the component's checkpoint with every nn.Linear quantized by `write`; puts the
    dequantized weights into `module` (the diffusers reference); returns {layer: dequantized}."""
    state = {k: v.contiguous() for k, v in module.state_dict().items()}
    expected = {}
    for name, layer in module.named_modules():
        if isinstance(layer, torch.nn.Linear):
            expected[name] = write(state, name, layer.weight)
            layer.weight.data = expected[name].clone()
    safetensors_torch.save_file(state, str(folder / weights_file))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", **config_extra}
    (folder / "config.json").write_text(json.dumps(config))
    return expected


@pytest.fixture(scope="module")
def imported(tmp_path_factory, source_repository):
    """Two checkpoints, NF4 UNet (with and without double quantization) and int8 text encoder,
    imported; the diffusers references run on the reference-dequantized weights."""
    work = tmp_path_factory.mktemp("bnb")
    tokenizer_dir = pathlib.Path(source_repository) / "tiny" / "tokenizer"
    repository = work / "imported"
    out = {}
    for name, double_quant in (("bnb-nf4", False), ("bnb-nf4dq", True)):
        src = work / f"{name}-diffusers"
        pipe = build_diffusers_pipeline(src, tokenizer_dir)
        unet = quantize_component(
            src / "unet", pipe.unet, "diffusion_pytorch_model.safetensors",
            {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
             "bnb_4bit_use_double_quant": double_quant},
            lambda s, p, w: write_nf4(s, p, w, double_quant))
        text = quantize_component(src / "text_encoder", pipe.text_encoder, "model.safetensors",
                                  {"load_in_8bit": True}, write_int8)
        done = run_import(src, repository / name, "--dtype", "float32")
        assert done.returncode == 0, done.stderr
        assert "bitsandbytes layers converted to nf4" in done.stdout, done.stdout
        assert "bitsandbytes layers converted to int8" in done.stdout, done.stdout
        out[name] = (pipe, unet, text)
    return out, repository, work


@pytest.fixture(scope="module")
def client(make_server, imported):
    _, repository, _ = imported

    def setup(models):
        for folder in repository.iterdir():
            shutil.copytree(folder, models / folder.name)

    return make_server(pipelines=(), load="all", setup=setup)


def dequantize_saved(path, layer):
    """The weight qpool's saved component computes with for `layer`."""
    import sys

    sys.path.insert(0, str(EXPORTER))
    from qpool_export import quant, weights_file

    module = weights_file.load_component(str(path))
    for name, sub in module.named_modules():
        if name == layer:
            # (a ScriptModule's `code` is its source: read the buffers by name)
            b = dict(sub.named_buffers(recurse=False))
            in_features = b["weight"].shape[1] * (2 if b["weight"].dtype == torch.uint8 else 1)
            return quant.dequantize_tensors(b["weight"], b["absmax"], b["code"],
                                            b["nested_absmax"], b["nested_code"], b["offset"],
                                            in_features)
    raise AssertionError(f"{path} has no layer {layer}")


@pytest.mark.parametrize("name", ["bnb-nf4", "bnb-nf4dq"])
def test_dequantized_weights_equal_the_reference_of_the_same_bytes(imported, name):
    pipes, repository, _ = imported
    _, unet, text = pipes[name]
    checked = 0
    for component, expected in (("unet", unet), ("text_encoder", text)):
        for layer, want in list(expected.items())[:6]:
            got = dequantize_saved(repository / name / f"{component}.pt", layer)
            assert torch.equal(got, want), f"{component}.{layer}"
            checked += 1
    assert checked == 12


def test_converted_components_are_served_quantized(client):
    pipelines = client.pipelines()
    for name in ("bnb-nf4", "bnb-nf4dq"):
        formats = {c.name: c.quantization for c in pipelines[name].components}
        assert formats == {"text_encoder": "int8", "unet": "nf4", "vae_decoder": "none"}


@pytest.mark.parametrize("name", ["bnb-nf4", "bnb-nf4dq"])
@pytest.mark.parametrize("scheduler", ["ddim", "euler"])
def test_images_match_diffusers_on_the_dequantized_weights(client, imported, name, scheduler):
    pipes, _, _ = imported
    pipe = pipes[name][0]
    prompt = "a red fox in the snow"
    want = diffusers_image(pipe, scheduler, 4, seed=5, prompt=prompt)
    got = qpool_image(client, name, scheduler, 4, seed=5, prompt=prompt)
    diff = np.abs(got - want)
    assert diff.max() <= 1, f"max {diff.max()} levels, mean {diff.mean():.3f}"


@pytest.mark.parametrize("case", ["fp4", "straddling blocks"])
def test_what_qpool_cannot_hold_losslessly_is_refused(source_repository, tmp_path, case):
    src = tmp_path / "src"
    pipe = build_diffusers_pipeline(src, pathlib.Path(source_repository) / "tiny" / "tokenizer")
    if case == "fp4":
        write, message = (lambda s, p, w: write_nf4(s, p, w, False, quant_type="fp4"),
                          "bitsandbytes fp4 weights")
    else:  # 64-element blocks over rows of 32: a block holds two rows' halves
        write, message = (lambda s, p, w: write_nf4(s, p, w, False, blocksize=64),
                          "not a whole number of 64-element blocks")
    quantize_component(src / "unet", pipe.unet, "diffusion_pytorch_model.safetensors",
                       {"load_in_4bit": True}, write)
    repository = tmp_path / "repo"
    repository.mkdir()
    done = run_import(src, repository / "model", "--dtype", "float32")
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert list(repository.iterdir()) == []
