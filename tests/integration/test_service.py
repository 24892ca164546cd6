"""Health, reflection and the ModelService (list, load, unload, memory report)."""

import os
import shutil
import subprocess

import grpc
import pytest

from conftest import TINY_DEFAULT_SIZE, TINY_DEFAULT_STEPS, rpc_error

SERVICES = ("qpool.v1.InferenceService", "qpool.v1.ModelService", "grpc.health.v1.Health")
COMPONENTS = {"text_encoder", "unet", "vae_decoder"}


@pytest.fixture(scope="module")
def client(make_server):
    # "spare" is a second copy of tiny that starts unloaded.
    return make_server(pipelines=("tiny", ("tiny", "spare")), load="tiny")


def load(client, name, device=""):
    return client.models.LoadPipeline(client.pb2.LoadPipelineRequest(name=name, device=device),
                                      timeout=300)


def unload(client, name):
    return client.models.UnloadPipeline(client.pb2.UnloadPipelineRequest(name=name), timeout=120)


@pytest.mark.parametrize("service", ("",) + SERVICES[:2])
def test_health_serving(client, service):
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    from grpc_health.v1 import health_pb2_grpc

    stub = health_pb2_grpc.HealthStub(client.channel)
    response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_services(client):
    reflection_pb2 = pytest.importorskip("grpc_reflection.v1alpha.reflection_pb2")
    from grpc_reflection.v1alpha import reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(client.channel)
    responses = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="*")]), timeout=10)
    names = {s.name for r in responses for s in r.list_services_response.service}
    for service in SERVICES:
        assert service in names, f"reflection does not list {service}: {sorted(names)}"


def test_reflection_describes_every_listed_service(client):
    """grpcurl and friends describe a service from its file descriptor: each service reflection
    lists (the health service included) must come with one."""
    reflection_pb2 = pytest.importorskip("grpc_reflection.v1alpha.reflection_pb2")
    from google.protobuf import descriptor_pb2
    from grpc_reflection.v1alpha import reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(client.channel)
    for service in SERVICES:
        (response,) = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=service)]),
            timeout=10)
        assert response.WhichOneof("message_response") == "file_descriptor_response", (
            service, response.error_response.error_message)
        files = [descriptor_pb2.FileDescriptorProto.FromString(raw)
                 for raw in response.file_descriptor_response.file_descriptor_proto]
        package, _, name = service.rpartition(".")
        assert any(f.package == package and name in {s.name for s in f.service}
                   for f in files), (service, [f.name for f in files])


def test_list_shows_states_and_defaults(client):
    pipelines = client.pipelines()
    assert set(pipelines) >= {"tiny", "spare"}
    tiny, spare = pipelines["tiny"], pipelines["spare"]
    assert tiny.state == client.pb2.PIPELINE_STATE_LOADED
    assert tiny.kind == "sd"
    assert tiny.device
    assert {c.name for c in tiny.components} == COMPONENTS
    assert tiny.default_steps == TINY_DEFAULT_STEPS
    assert (tiny.default_width, tiny.default_height) == (TINY_DEFAULT_SIZE, TINY_DEFAULT_SIZE)
    assert {"ddim", "euler"} <= set(tiny.schedulers)
    assert tiny.in_flight == 0
    assert spare.state == client.pb2.PIPELINE_STATE_AVAILABLE
    assert spare.error == ""


def test_load_then_already_loaded(client):
    first = load(client, "spare")
    assert not first.already_loaded
    assert first.pipeline.state == client.pb2.PIPELINE_STATE_LOADED
    assert {c.name for c in first.pipeline.components} == COMPONENTS
    assert first.load_seconds > 0
    # Note [Load stages]: the component files' bytes, and stages that fit in the load's time.
    st = first.stages
    folder = client.server.repository / "spare"
    # (graphs and weights files: Note [Weights beside the graph])
    assert st.read_bytes == sum(f.stat().st_size for pattern in ("*.pt", "*.safetensors")
                                for f in folder.glob(pattern))
    assert st.read_seconds > 0 and st.pack_seconds > 0
    stages = (st.verify_seconds, st.read_seconds, st.quantize_seconds, st.pack_seconds,
              st.device_seconds, st.warmup_seconds)
    assert min(stages) >= 0 and sum(stages) <= first.load_seconds
    second = load(client, "spare")
    assert not second.HasField("stages")
    assert second.already_loaded
    assert second.pipeline.state == client.pb2.PIPELINE_STATE_LOADED
    assert client.pipelines()["spare"].state == client.pb2.PIPELINE_STATE_LOADED


def test_load_on_explicit_cpu_device(client):
    try:
        unload(client, "spare")  # whatever an earlier test left, on whatever device
    except grpc.RpcError:
        pass
    response = load(client, "spare", device="cpu")
    assert response.pipeline.device == "cpu"
    assert all(c.device == "cpu" for c in response.pipeline.components)
    assert load(client, "spare", device="cpu").already_loaded


def test_unload_then_generate_fails_then_reload_works(client):
    load(client, "spare")
    response = unload(client, "spare")
    assert response.name == "spare"
    assert response.freed_bytes > 0
    assert client.pipelines()["spare"].state == client.pb2.PIPELINE_STATE_AVAILABLE

    error = rpc_error(client.generate, pipeline="spare", prompt="x", steps=1)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "load" in error.details().lower(), error.details()

    again = load(client, "spare")
    assert not again.already_loaded
    result = client.generate_one(pipeline="spare", prompt="back again", steps=1, seed=3)
    assert len(result.images) == 1


def test_unload_not_loaded_is_failed_precondition(client):
    load(client, "spare")
    unload(client, "spare")
    error = rpc_error(unload, client, "spare")
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "spare" in error.details()


def test_unknown_names_are_not_found(client):
    for call in (load, unload):
        error = rpc_error(call, client, "does-not-exist")
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "does-not-exist" in error.details()


def test_memory_report(client):
    load(client, "spare")
    report = client.models.GetMemoryReport(client.pb2.GetMemoryReportRequest(), timeout=30)
    devices = {d.device: d for d in report.devices}
    assert "cpu" in devices, f"no cpu device in {sorted(devices)}"
    pipelines = {p.name: p for p in report.pipelines}
    assert set(pipelines) >= {"tiny", "spare"}
    for pipeline in pipelines.values():
        assert pipeline.state == client.pb2.PIPELINE_STATE_LOADED
        assert {c.name for c in pipeline.components} == COMPONENTS
        for component in pipeline.components:
            assert component.weight_bytes > 0, f"{pipeline.name}/{component.name}"
            assert component.device
            assert component.quantization == "none"
    # Unloaded pipelines leave the report.
    unload(client, "spare")
    report = client.models.GetMemoryReport(client.pb2.GetMemoryReportRequest(), timeout=30)
    assert "spare" not in {p.name for p in report.pipelines}


def test_load_on_another_device_than_the_loaded_one_is_refused(client):
    device = os.environ.get("QPOOL_TEST_DEVICE", "cpu")
    if not device.startswith("cuda"):
        pytest.skip("needs the server's pipelines on a GPU")
    try:
        unload(client, "spare")
    except grpc.RpcError:
        pass
    assert load(client, "spare").pipeline.device == device
    error = rpc_error(load, client, "spare", device="cpu")
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"already loaded on {device}" in error.details()


def test_a_second_server_on_a_port_in_use_refuses_to_start(make_server, server_bin, tmp_path):
    """gRPC's SO_REUSEPORT would let both bind and answer clients at random."""
    first = make_server()
    port = first.address.rsplit(":", 1)[1]
    repository = tmp_path / "models"
    repository.mkdir()
    done = subprocess.run([str(server_bin), "--model-repository", str(repository), "--listen",
                           f"127.0.0.1:{port}", "--device", "cpu"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr
    # The first server still answers.
    assert "tiny" in first.pipelines()


def test_a_loaded_pipeline_whose_folder_was_deleted_is_still_listed(make_server):
    """It kept serving but ListPipelines hid it, so an operator could not see or unload it."""
    client = make_server(pipelines=("tiny", ("tiny", "spare")), load="spare")
    shutil.rmtree(client.server.repository / "spare")
    listed = client.pipelines()
    assert listed["spare"].state == client.pb2.PIPELINE_STATE_LOADED
    assert "tiny" in listed
    assert client.generate_one(pipeline="spare", prompt="a red cube", seed=1).images
    client.models.UnloadPipeline(client.pb2.UnloadPipelineRequest(name="spare"), timeout=60)
    assert "spare" not in client.pipelines()


def test_a_loaded_pipeline_whose_files_changed_says_so_until_loaded_again(make_server, cli_bin):
    """Re-importing over a loaded pipeline kept serving the old tensors with no sign; the
    pipeline now lists the files that changed since it read them."""
    client = make_server(pipelines=(("tiny", "changing"),), load="all")
    folder = client.server.repository.resolve() / "changing"

    def changed():
        listed = client.models.ListPipelines(client.pb2.ListPipelinesRequest(), timeout=30)
        return list(next(p for p in listed.pipelines if p.name == "changing").files_changed)

    assert changed() == []
    # What an import does: a new file in its place (same bytes here, so it loads again).
    weights = folder / "unet.safetensors"
    shutil.copyfile(weights, folder / "unet.safetensors.new")
    os.replace(folder / "unet.safetensors.new", weights)
    assert changed() == [str(weights)]
    shown = subprocess.run([cli_bin, "--server", client.server.address, "list"],
                           capture_output=True, text=True, timeout=60)
    assert f"changing: serves what it read at load; changed on disk since: {weights}" in \
        shown.stdout, shown.stdout
    unload(client, "changing")
    assert load(client, "changing").pipeline.state == client.pb2.PIPELINE_STATE_LOADED
    assert changed() == []
