"""SDXL imported with w8a8 and `--min-weights` (Note [Small layers stay float]): the UNet's
smallest linear layers stay float in the imported file, the manifest carries min_weights, and the
server's load-time quantization keeps the same layers float, so both give the same PNG. The
tiny pipeline, its source and the import helpers are test_import_sdxl.py's.
"""

import pytest

torch = pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")
pytest.importorskip("diffusers")
pytest.importorskip("transformers")
pytest.importorskip("safetensors.torch")

import test_import_diffusers as sd_tests  # noqa: E402
from test_import_sdxl import (PROMPT, SIZE,  # noqa: E402,F401 - fixtures too
                              imported_into, one_thread, source, tokenizer_dir)


@pytest.fixture(scope="module")
def served_pipelines(tmp_path_factory, source):
    """{name: folder}: the float32 import, and w8a8 of all but the UNet's smallest linear layers
    quantized at import and by the server at load."""
    folder, pipe = source
    repository = tmp_path_factory.mktemp("w8a8")
    pipelines = {"sdxl": imported_into(repository, "sdxl", folder, "--dtype", "float32")}
    sizes = sorted({m.weight.numel() for m in pipe.unet.modules() if isinstance(m, torch.nn.Linear)})
    threshold = str(sizes[1])
    for name, mode in (("sdxl-w8a8-large", "prequantized"), ("sdxl-w8a8-large-load", "load-time")):
        pipelines[name] = imported_into(repository, name, folder, "--dtype", "float32",
                                        "--quantize", "unet=w8a8", "--min-weights", threshold,
                                        "--quant-mode", mode)
    # A threshold above every text-encoder layer and below some of the UNet's: the encoders
    # stay float as a whole (SDXL's CLIP-L at a threshold meant for its UNet).
    encoders = max(m.weight.numel() for e in (pipe.text_encoder, pipe.text_encoder_2)
                   for m in e.modules() if isinstance(m, torch.nn.Linear))
    assert sizes[-1] > encoders
    everything = "unet=w8a8,text_encoder=w8a8,text_encoder_2=w8a8"
    for name, mode in (("sdxl-w8a8-unet", "prequantized"), ("sdxl-w8a8-unet-load", "load-time")):
        pipelines[name] = imported_into(repository, name, folder, "--dtype", "float32",
                                        "--quantize", everything,
                                        "--min-weights", str(encoders + 1), "--quant-mode", mode)
    return pipelines


@pytest.fixture(scope="module")
def client(make_server, served_pipelines):
    return make_server(pipelines=(), load="all", folders=served_pipelines)


def unet_quantization(folder):
    return yaml.safe_load((folder / "pipeline.yaml").read_text())["components"]["unet"][
        "quantization"]


def test_min_weights_keeps_the_same_small_layers_float_at_import_and_at_load(
        client, served_pipelines):
    """--min-weights leaves the UNet's smaller linear layers float in the imported file and writes
    min_weights to the manifest, which the server's load-time quantization applies alike: the
    same layers quantized, so the same PNG."""
    folder = served_pipelines["sdxl-w8a8-large"]
    section = unet_quantization(folder)
    assert section["format"] == "w8a8" and section["min_weights"] > 0
    kinds = [m.original_name for _, m in sd_tests.load_component(folder / "unet.pt").named_modules()]
    assert kinds.count("QuantLinear") > 0 and kinds.count("Linear") > 0, kinds
    assert unet_quantization(served_pipelines["sdxl-w8a8-large-load"]) == section
    request = dict(pipeline="sdxl-w8a8-large", prompt=PROMPT, steps=3, width=SIZE, height=SIZE,
                   seed=7, scheduler="euler")
    got = client.generate_one(**request).images[0].png
    assert got == client.generate_one(**dict(request, pipeline="sdxl-w8a8-large-load")).images[0].png
    assert got != client.generate_one(**dict(request, pipeline="sdxl")).images[0].png


def test_a_component_with_every_layer_below_min_weights_stays_float(client, served_pipelines):
    """Both text encoders asked for w8a8 with a threshold above their largest layer: the import
    keeps them float and writes no quantization for them, the load-time twin's server keeps them
    float as well (no load error), and the two give the same PNG."""
    folder = served_pipelines["sdxl-w8a8-unet"]
    components = yaml.safe_load((folder / "pipeline.yaml").read_text())["components"]
    for name in ("text_encoder", "text_encoder_2"):
        assert "quantization" not in components[name], components[name]
        kinds = [m.original_name for _, m in sd_tests.load_component(folder / f"{name}.pt").named_modules()]
        assert "QuantLinear" not in kinds, name
    assert components["unet"]["quantization"]["format"] == "w8a8"
    load = yaml.safe_load((served_pipelines["sdxl-w8a8-unet-load"] / "pipeline.yaml").read_text())
    assert load["components"]["text_encoder"]["quantization"]["format"] == "w8a8"
    for name in ("sdxl-w8a8-unet", "sdxl-w8a8-unet-load"):
        info = client.pipelines()[name]
        assert info.state == client.pb2.PIPELINE_STATE_LOADED, info
    request = dict(pipeline="sdxl-w8a8-unet", prompt=PROMPT, steps=3, width=SIZE, height=SIZE,
                   seed=7, scheduler="euler")
    got = client.generate_one(**request).images[0].png
    assert got == client.generate_one(**dict(request, pipeline="sdxl-w8a8-unet-load")).images[0].png
