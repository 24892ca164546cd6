"""Kind hidream on a GPU: the tiny HiDreamImagePipeline of test_import_hidream.py imported in
bfloat16 (and with its transformer and Llama in NF4), served on cuda:0 with CUDA graphs on: the
routed experts are grouped in both (Note [Routed experts] in hidream_experts.py), so both
transformers replay graphs.

The field report's case at a small size: under the `model` offload policy an Encode-only
request (prompt encoding alone, the Llama last) leaves nothing of the pipeline on the GPU, and
the device's allocated bytes come back to where they were; the Llama did run there (its onload
and offload are among the memory events). Images in bfloat16 stay close to diffusers' float32
images on the CPU for the same latents. With two GPUs, the NF4 pipeline moved from cuda:0 to
cuda:1 leaves nothing on cuda:0 and makes the same image. Skips without a GPU (the move test
without two)."""

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

import numpy as np  # noqa: E402

import test_import_hidream as hidream_tests  # noqa: E402 - after the skips
from conftest import Client, QpoolServer, copy_placed  # noqa: E402
from png_reader import read_png  # noqa: E402

SIZE = hidream_tests.SIZE
NAMES = ("hidream-bf16", "hidream-nf4")
MIN_PSNR_DB = 25.0  # bfloat16 on the GPU against float32 on the CPU


@pytest.fixture(scope="module")
def source(tmp_path_factory, tokenizer_files):
    folder = tmp_path_factory.mktemp("hidream_gpu") / "hidream-dev"
    return folder, hidream_tests.build_hidream_pipeline(folder, tokenizer_files)


@pytest.fixture(scope="module")
def repository(tmp_path_factory, source):
    repository = tmp_path_factory.mktemp("hidream_gpu_models")
    for name, extra in (("hidream-bf16", ()),
                        ("hidream-nf4", ("--quantize", "transformer=nf4,text_encoder_4=nf4"))):
        done = hidream_tests.run_import(source[0], repository / name, "--dtype", "bfloat16",
                                        *extra)
        assert done.returncode == 0, done.stderr
    return repository


@pytest.fixture(scope="module")
def client(server_bin, pb, tmp_path_factory, repository):
    work = tmp_path_factory.mktemp("hidream_gpu_server")
    server = QpoolServer(server_bin, repository, work, load="all", device="cuda:0")
    server.start()
    client = Client(server, pb)
    yield client
    client.close()
    assert server.stop() == 0, server.stderr_text()


def memory(client):
    report = client.models.GetMemoryReport(client.pb2.GetMemoryReportRequest(max_events=1000))
    return report, next(d for d in report.devices if d.device == "cuda:0")


@pytest.mark.parametrize("name", NAMES)
def test_images_on_the_gpu_follow_diffusers(client, source, name):
    _, pipe = source
    steps, seed, guidance = 3, 5, 5.0
    result = client.generate_one(pipeline=name, prompt=hidream_tests.PROMPT, steps=steps,
                                 guidance_scale=guidance, seed=seed, width=SIZE, height=SIZE)
    assert result.device == "cuda:0"
    want = hidream_tests.diffusers_images(pipe, steps, seed, hidream_tests.PROMPT, guidance)[0]
    png = read_png(result.images[0].png)
    got = np.frombuffer(b"".join(png.rows), dtype=np.uint8).reshape(SIZE, SIZE, 3)
    mse = np.mean((got.astype(np.float64) - want.astype(np.float64)) ** 2)
    psnr = 10 * np.log10(255.0 ** 2 / mse) if mse else float("inf")
    print(f"HIDREAM_GPU_PSNR {name} {psnr:.2f} dB")
    assert want.std() > 5, "a flat reference image compares nothing"
    assert psnr >= MIN_PSNR_DB, f"{name}: {psnr:.2f} dB"


@pytest.mark.parametrize("name", NAMES)
def test_the_grouped_transformer_replays_graphs_in_every_format(client, name):
    result = client.generate_one(pipeline=name, prompt=hidream_tests.PROMPT, steps=3,
                                 guidance_scale=5.0, seed=6, width=SIZE, height=SIZE)
    assert result.device == "cuda:0"
    report, _ = memory(client)
    pipeline = next(p for p in report.pipelines if p.name == name)
    transformer = next(c for c in pipeline.components if c.name == "transformer")
    assert transformer.graph_bytes > 0, transformer


@pytest.mark.parametrize("name", NAMES)
def test_encode_only_under_model_leaves_nothing_on_the_gpu(client, name):
    pb = client.pb2
    client.models.SetOffloadPolicy(pb.SetOffloadPolicyRequest(
        name=name, policy=pb.OffloadPolicy(policy="model")))
    prompts = ["a red fox in the snow", "a lighthouse at dusk"]
    client.inference.Encode(pb.EncodeRequest(pipeline=name, prompts=prompts), timeout=120)
    client.models.EmptyCache(pb.EmptyCacheRequest())
    before, device_before = memory(client)
    reply = client.inference.Encode(pb.EncodeRequest(pipeline=name, prompts=prompts),
                                    timeout=120)
    after, device_after = memory(client)
    assert list(reply.llm_embeddings.shape)[1:3] == [2, hidream_tests.LENGTH]
    pipeline = next(p for p in after.pipelines if p.name == name)
    on_gpu = {c.name: c.weight_bytes + c.quant_state_bytes + c.other_bytes
              for c in pipeline.components if c.residency == "device"}
    assert {c.residency for c in pipeline.components} == {"host"}
    assert sum(on_gpu.values()) == 0, on_gpu
    assert device_after.allocated_bytes == device_before.allocated_bytes
    moved = {(e.kind, e.component) for e in after.events
             if e.sequence > before.last_sequence and e.pipeline == name
             and e.device == "cuda:0"}
    assert {("onload", "text_encoder_4"), ("offload", "text_encoder_4")} <= moved, moved


def image(client, name, seed):
    result = client.generate_one(pipeline=name, prompt=hidream_tests.PROMPT, steps=3,
                                 guidance_scale=5.0, seed=seed, width=SIZE, height=SIZE)
    png = read_png(result.images[0].png)
    return result.device, np.frombuffer(b"".join(png.rows), dtype=np.uint8).astype(np.int16)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_nf4_pipeline_moved_to_the_second_gpu(server_bin, pb, repository, tmp_path):
    """The field report's case for HiDream: the NF4 pipeline (transformer and Llama in NF4)
    loaded on cuda:0 and moved to cuda:1 keeps every tensor, quant state included, on cuda:1,
    gives cuda:0 back every byte it held, and makes the same image there."""
    models_dir = tmp_path / "models"
    copy_placed(repository / "hidream-nf4", models_dir, "hidream-nf4", device="cuda:0,cuda:1")
    server = QpoolServer(server_bin, models_dir, tmp_path, load=None, device="cuda")
    server.start()
    client = Client(server, pb)
    try:
        models, pb2, allocated = client.models, client.pb2, client.allocated

        def load_on_cuda0():
            models.LoadPipeline(pb2.LoadPipelineRequest(name="hidream-nf4", device="cuda:0"),
                                timeout=300)
            return image(client, "hidream-nf4", 21)

        # The first request leaves the libraries' workspaces on cuda:0 for the server's life
        # (not the pipeline's bytes): the baseline is taken after a load, request and unload.
        load_on_cuda0()
        models.UnloadPipeline(pb2.UnloadPipelineRequest(name="hidream-nf4"), timeout=300)
        baseline = allocated("cuda:0")
        device, before = load_on_cuda0()
        assert device == "cuda:0" and allocated("cuda:0") > baseline
        moved = models.MovePipeline(pb2.MovePipelineRequest(name="hidream-nf4", device="cuda:1"),
                                    timeout=300)
        assert moved.pipeline.device == "cuda:1"
        report = models.GetMemoryReport(pb2.GetMemoryReportRequest(max_events=0))
        pipeline = next(p for p in report.pipelines if p.name == "hidream-nf4")
        assert {c.device for c in pipeline.components} == {"cuda:1"}, pipeline.components
        quant_state = {c.name: c.quant_state_bytes for c in pipeline.components}
        assert quant_state["transformer"] > 0 and quant_state["text_encoder_4"] > 0
        assert allocated("cuda:0") == baseline
        device, after = image(client, "hidream-nf4", 21)
        assert device == "cuda:1"
        assert np.abs(after - before).max() <= 1
    finally:
        client.close()
        assert server.stop() == 0, server.stderr_text()

