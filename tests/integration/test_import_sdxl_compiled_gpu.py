"""A compiled SDXL UNet runs on a GPU (Note [Compiled forward]): the tiny SDXL of
test_import_sdxl.py imported in float16 with its UNet compiled for CUDA, served on cuda:0. Every
UNet forward must be answered by the package; the server passes the UNet's timestep and time ids
in float32, and a package compiled with float16 time ids was bypassed at every step without a
word. Skips without a GPU."""

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

import test_import_sdxl as sdxl_tests  # noqa: E402 - after the skips
from conftest import Client, QpoolServer  # noqa: E402
from test_compiled import forwards  # noqa: E402


@pytest.fixture(scope="module")
def client(server_bin, pb, tmp_path_factory, tokenizer_files):
    work = tmp_path_factory.mktemp("sdxl_compiled_gpu")
    src = work / "sdxl-diffusers"
    sdxl_tests.build_sdxl_pipeline(src, tokenizer_files[0])
    repository = work / "models"
    done = sdxl_tests.run_import(src, repository / "sdxl-compiled", "--dtype", "float16",
                                 "--compile", "unet", "--compile-device", "cuda")
    assert done.returncode == 0, done.stderr
    server = QpoolServer(server_bin, repository, work, load="sdxl-compiled", device="cuda")
    server.start()
    client = Client(server, pb)
    yield client
    client.close()
    assert server.stop() == 0, server.stderr_text()


def test_every_unet_forward_runs_the_package(client):
    before = forwards(client)
    reply = client.generate_one(pipeline="sdxl-compiled", prompt="a red fox", steps=3, seed=1)
    assert reply.device.startswith("cuda")
    after = forwards(client)
    for path, want in (("compiled", 3), ("torchscript", 0)):
        key = ("sdxl-compiled", "unet", path)
        assert after[key] - before.get(key, 0) == want, path
    log = client.server.stderr_text() + "\n".join(client.server.stdout_lines)
    assert "running TorchScript" not in log
    # Note [Compiled attention]: compiled under the order this server runs.
    assert "attention order cudnn" in log or "attention order flash" in log, log[-2000:]
    assert "attention kernels were chosen under" not in log
    assert "records no attention order" not in log
