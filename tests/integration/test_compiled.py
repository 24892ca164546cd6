"""The compiled forward (Note [Compiled forward] in server/component/compiled_forward.h) through
the real server: tiny with its UNet also compiled for the CPU (test-models/tiny-compiled, exported
at build time with `--compile unet`) runs its compiled forward, serves the same images as tiny
within rounding, holds the same bytes, and unloads without leaks. tiny-nf4-compiled (`--quantize
nf4 --compile unet`) does the same against tiny-nf4, its package calling qpool's quantized linear
op."""

import grpc
import pytest

from conftest import parse_samples, promtool_check, rpc_error, scrape
from png_reader import max_abs_diff, read_png

# Generated kernels round differently from TorchScript's ops; over a few denoising steps that
# moves a pixel by a level or two of 255.
PIXEL_TOLERANCE = 3


def assert_same_image(a, b, what):
    diff = max_abs_diff(read_png(a.images[0].png), read_png(b.images[0].png))
    assert diff <= PIXEL_TOLERANCE, f"{what}: pixels differ by up to {diff}"


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny", "tiny-compiled", "tiny-nf4", "tiny-nf4-compiled"),
                       load="all")


def _components(client, name):
    listed = client.models.ListPipelines(client.pb2.ListPipelinesRequest(), timeout=30)
    (pipeline,) = [p for p in listed.pipelines if p.name == name]
    return {c.name: (c.weight_bytes, c.quant_state_bytes, c.other_bytes, c.graph_bytes)
            for c in pipeline.components}


def test_manifest_names_the_package(source_repository):
    text = (source_repository / "tiny-compiled" / "pipeline.yaml").read_text()
    assert "compiled:" in text and "file: unet.cpu.pt2" in text and "device: cpu" in text
    assert (source_repository / "tiny-compiled" / "unet.cpu.pt2").exists()


@pytest.mark.parametrize("plain_name", ["tiny", "tiny-nf4"])
def test_same_image_as_torchscript_within_rounding(client, plain_name):
    for seed in (3, 11):
        plain = client.generate_one(pipeline=plain_name, prompt="a red fox", steps=3, seed=seed)
        compiled = client.generate_one(pipeline=f"{plain_name}-compiled", prompt="a red fox",
                                       steps=3, seed=seed)
        assert_same_image(compiled, plain, f"{plain_name}, seed {seed}")


def test_compiled_forward_is_used(client):
    client.generate_one(pipeline="tiny-compiled", prompt="a fox", steps=2, seed=1)
    log = client.server.stderr_text() + "\n".join(client.server.stdout_lines)
    assert "compiled forward" in log, "the package was not attached"
    assert "running TorchScript" not in log
    # Note [Compiled attention]: the package names the order it was compiled under (on a CPU,
    # ATen's unsettled one); only CUDA packages are compared with the server's.
    assert "for cpu, attention order flash, efficient, math, cudnn, overrideable" in log


def forwards(client):
    """{(pipeline, component, path): count} of qpool_component_forwards_total."""
    out = {}
    for (name, labels), value in parse_samples(scrape(client)).items():
        if name == "qpool_component_forwards_total":
            labels = dict(labels)
            out[(labels["pipeline"], labels["component"], labels["path"])] = value
    return out


def test_forwards_are_counted_by_path(client):
    """qpool_component_forwards_total: each denoising step is one UNet forward, answered by the
    package in tiny-compiled and by TorchScript in tiny; the text encoder and VAE, which have no
    package, run TorchScript in both."""
    before = forwards(client)
    for name in ("tiny", "tiny-compiled"):
        client.generate_one(pipeline=name, prompt="a fox", steps=3, seed=2)
    after = forwards(client)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta[("tiny-compiled", "unet", "compiled")] == 3
    assert delta[("tiny-compiled", "unet", "torchscript")] == 0
    assert delta[("tiny", "unet", "torchscript")] == 3
    assert delta[("tiny", "unet", "compiled")] == 0
    for name in ("tiny", "tiny-compiled"):
        assert delta[(name, "vae_decoder", "torchscript")] == 1
        assert delta[(name, "text_encoder", "compiled")] == 0


def test_components_with_a_package_are_marked(client):
    """qpool_compiled_forward_info: one series per component with a package, naming the
    attention order it was compiled under; none for the components without one."""
    text = scrape(client)
    promtool_check(text)
    marked = {(dict(labels)["pipeline"], dict(labels)["component"]): (dict(labels), value)
              for (name, labels), value in parse_samples(text).items()
              if name == "qpool_compiled_forward_info"}
    assert set(marked) == {("tiny-compiled", "unet"), ("tiny-nf4-compiled", "unet")}
    for labels, value in marked.values():
        assert value == 1 and labels["device"] == "cpu"
        assert labels["attention"] == "flash, efficient, math, cudnn, overrideable"


def test_quantized_package_runs_for_every_step(client):
    before = forwards(client)
    client.generate_one(pipeline="tiny-nf4-compiled", prompt="a fox", steps=3, seed=2)
    after = forwards(client)
    assert after[("tiny-nf4-compiled", "unet", "compiled")] - \
        before.get(("tiny-nf4-compiled", "unet", "compiled"), 0) == 3
    assert after[("tiny-nf4-compiled", "unet", "torchscript")] == 0


@pytest.mark.parametrize("plain_name", ["tiny", "tiny-nf4"])
def test_same_bytes_as_torchscript(client, plain_name):
    assert _components(client, f"{plain_name}-compiled") == _components(client, plain_name)


def test_offload_is_refused_on_cpu_and_unload_leaks_nothing(client):
    pb2 = client.pb2
    error = rpc_error(client.models.OffloadPipeline, pb2.OffloadPipelineRequest(name="tiny-compiled"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "CPU" in error.details()
    held = sum(sum(v[:3]) for v in _components(client, "tiny-compiled").values())
    unloaded = client.models.UnloadPipeline(pb2.UnloadPipelineRequest(name="tiny-compiled"),
                                            timeout=60)
    assert unloaded.leaked_bytes == 0
    assert unloaded.freed_bytes == held
    loaded = client.models.LoadPipeline(pb2.LoadPipelineRequest(name="tiny-compiled"), timeout=120)
    assert loaded.pipeline.name == "tiny-compiled"
    again = client.generate_one(pipeline="tiny-compiled", prompt="a red fox", steps=3, seed=3)
    plain = client.generate_one(pipeline="tiny", prompt="a red fox", steps=3, seed=3)
    assert_same_image(again, plain, "after a reload")
