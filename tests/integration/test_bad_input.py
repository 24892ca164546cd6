"""Bad requests get the right status code and a message naming what to change, and the server
keeps serving afterwards; a broken manifest fails only its own pipeline; unloading a busy
pipeline is refused while its request completes."""

import math
import os
import subprocess
import threading
import time

import grpc
import pytest

from png_reader import max_abs_diff, read_png
from conftest import TINY_MAX_IMAGES, TINY_MAX_SIZE, TINY_MAX_STEPS, break_manifest, rpc_error

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def assert_load_refused(client, name, *words):
    """Loading `name` fails with INVALID_ARGUMENT naming its manifest and `words`, and the
    pipeline is listed as failed."""
    error = rpc_error(client.models.LoadPipeline, client.pb2.LoadPipelineRequest(name=name))
    assert error.code() == INVALID
    details = error.details()
    for part in (f"{name}/pipeline.yaml: ",) + words:
        assert part in details, (part, details)
    assert client.pipelines()[name].state == client.pb2.PIPELINE_STATE_FAILED


def drop_digests(folder):
    """The manifest in `folder` without its components' sha256 lines."""
    manifest = folder / "pipeline.yaml"
    lines = manifest.read_text().splitlines()
    manifest.write_text("".join(f"{line}\n" for line in lines if "sha256:" not in line))


def add_broken(repository):
    import shutil

    shutil.copytree(repository / "tiny", repository / "broken")
    break_manifest(repository / "broken")


@pytest.fixture(scope="module")
def client(make_server):
    # tiny: loaded; idle: a copy of tiny that is never loaded; broken: manifest without
    # components.unet.file.
    return make_server(pipelines=("tiny", ("tiny", "idle")), load="tiny", setup=add_broken)


def assert_still_serving(client):
    result = client.generate_one(pipeline="tiny", prompt="still serving", steps=1, seed=1)
    assert len(result.images) == 1


# (id, request fields, expected code, words of which at least one must be in the message)
GENERATE_CASES = [
    ("unknown-pipeline", dict(pipeline="no-such-pipeline"), grpc.StatusCode.NOT_FOUND,
     ["no-such-pipeline"]),
    ("too-many-steps", dict(steps=TINY_MAX_STEPS + 1), INVALID, ["steps"]),
    ("huge-steps", dict(steps=1_000_000), INVALID, ["steps"]),
    ("width-not-multiple-of-8", dict(width=60), INVALID, ["width"]),
    ("height-not-multiple-of-8", dict(height=63), INVALID, ["height"]),
    ("width-over-limit", dict(width=TINY_MAX_SIZE + 8), INVALID, ["width"]),
    ("height-over-limit", dict(height=TINY_MAX_SIZE + 8), INVALID, ["height"]),
    ("too-many-images", dict(num_images=TINY_MAX_IMAGES + 1), INVALID, ["num_images", "images"]),
    ("guidance-nan", dict(guidance_scale=math.nan), INVALID, ["guidance"]),
    ("guidance-negative", dict(guidance_scale=-1.0), INVALID, ["guidance"]),
    ("guidance-inf", dict(guidance_scale=math.inf), INVALID, ["guidance"]),
    ("unknown-scheduler", dict(scheduler="warp-drive"), INVALID, ["warp-drive", "scheduler"]),
    ("path-parent", dict(pipeline="../tiny"), INVALID, ["../tiny", "pipeline", "name"]),
    ("path-absolute", dict(pipeline="/etc/passwd"), INVALID, ["/etc/passwd", "pipeline", "name"]),
    ("path-nested", dict(pipeline="a/b"), INVALID, ["a/b", "pipeline", "name"]),
    ("empty-pipeline", dict(pipeline=""), INVALID, ["pipeline", "name"]),
    ("not-loaded", dict(pipeline="idle"), grpc.StatusCode.FAILED_PRECONDITION, ["load"]),
]


@pytest.mark.parametrize("fields,code,words", [c[1:] for c in GENERATE_CASES],
                         ids=[c[0] for c in GENERATE_CASES])
def test_bad_generate(client, fields, code, words):
    request = dict(pipeline="tiny", prompt="bad input", steps=1, seed=1)
    request.update(fields)
    error = rpc_error(client.generate, **request)
    assert error.code() == code, f"{error.code()}: {error.details()}"
    message = error.details() or ""
    assert any(w.lower() in message.lower() for w in words), (
        f"message {message!r} names none of {words}")
    assert_still_serving(client)


def test_encode_without_prompts(client):
    error = rpc_error(client.inference.Encode, client.pb2.EncodeRequest(pipeline="tiny", prompts=[]))
    assert error.code() == INVALID
    assert "prompt" in error.details().lower()
    assert_still_serving(client)


@pytest.mark.parametrize("name", ["../tiny", "/etc/passwd", "a/b"])
def test_path_like_names_in_model_service(client, name):
    for call in (client.models.LoadPipeline, client.models.UnloadPipeline):
        request_type = (client.pb2.LoadPipelineRequest if call is client.models.LoadPipeline
                        else client.pb2.UnloadPipelineRequest)
        error = rpc_error(call, request_type(name=name))
        assert error.code() == INVALID, f"{error.code()}: {error.details()}"
    error = rpc_error(client.inference.Encode, client.pb2.EncodeRequest(pipeline=name, prompts=["x"]))
    assert error.code() == INVALID


def test_broken_manifest_fails_only_its_pipeline(client):
    error = rpc_error(client.models.LoadPipeline, client.pb2.LoadPipelineRequest(name="broken"))
    assert error.code() == INVALID, f"{error.code()}: {error.details()}"
    assert "pipeline.yaml" in error.details()
    assert "components.unet.file" in error.details()
    broken = client.pipelines()["broken"]
    assert broken.state == client.pb2.PIPELINE_STATE_FAILED
    assert "components.unet.file" in broken.error
    # No defaults of a manifest that does not parse (the built-in ones used to show).
    assert (broken.kind, broken.default_steps, broken.default_width) == ("", 0, 0), broken
    assert client.pipelines()["tiny"].state == client.pb2.PIPELINE_STATE_LOADED
    assert_still_serving(client)
    # Generate on the failed pipeline is refused, not crashed.
    error = rpc_error(client.generate, pipeline="broken", prompt="x", steps=1)
    assert error.code() in (grpc.StatusCode.FAILED_PRECONDITION, INVALID)


def test_unload_with_request_in_flight(client):
    # As many steps as the limits allow (also checks that max_steps itself is accepted), so the
    # request is still running when Unload arrives right after its first progress event.
    request = client.pb2.GenerateRequest(pipeline="tiny", prompt="long", steps=TINY_MAX_STEPS,
                                         num_images=2, seed=5)
    stream = client.inference.Generate(request, timeout=600)
    first = next(stream)
    assert first.WhichOneof("event") == "progress"

    error = rpc_error(client.models.UnloadPipeline, client.pb2.UnloadPipelineRequest(name="tiny"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert "in flight" in error.details(), error.details()
    info = client.pipelines()["tiny"]
    assert info.state == client.pb2.PIPELINE_STATE_LOADED
    assert info.in_flight >= 1

    rest = list(stream)
    assert rest[-1].WhichOneof("event") == "result", "the in-flight request did not complete"
    assert len(rest[-1].result.images) == 2
    progress = [first] + [r for r in rest if r.WhichOneof("event") == "progress"]
    assert [p.progress.step for p in progress] == list(range(1, TINY_MAX_STEPS + 1))
    assert_still_serving(client)


def test_concurrent_requests_all_complete(client):
    results, errors = [], []

    def run(seed):
        try:
            results.append(client.generate_one(pipeline="tiny", prompt="together", steps=2,
                                               seed=seed))
        except grpc.RpcError as e:  # collected, asserted below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, [f"{e.code()}: {e.details()}" for e in errors]
    assert sorted(r.seed for r in results) == [0, 1, 2, 3]
    # Same seed alone gives the same image as in the concurrent run (the server may batch
    # concurrent requests, so allow float rounding in the decoded pixels).
    alone = client.generate_one(pipeline="tiny", prompt="together", steps=2, seed=2)
    together = next(r for r in results if r.seed == 2)
    diff = max_abs_diff(read_png(alone.images[0].png), read_png(together.images[0].png))
    assert diff <= 3, f"seed 2 alone and under concurrency differ by {diff}"
    deadline = time.monotonic() + 10
    while client.pipelines()["tiny"].in_flight and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.pipelines()["tiny"].in_flight == 0


def test_manifest_bytes_that_are_not_utf8_never_break_a_reply(make_server, cli_bin):
    """A manifest's value that is not UTF-8 reaches replies through the load's error; proto3
    strings must be UTF-8, or every ListPipelines fails for every client."""
    def setup(models):
        bad = models / "bad-bytes"
        bad.mkdir()
        (bad / "pipeline.yaml").write_bytes(b"kind: \"sd\xff\xfe\"\ncomponents: {}\n")

    client = make_server(setup=setup)
    pipelines = client.pipelines()  # grpcio fails to parse a reply with invalid UTF-8
    assert pipelines["tiny"].state == client.pb2.PIPELINE_STATE_LOADED
    bad = pipelines["bad-bytes"]
    assert bad.state == client.pb2.PIPELINE_STATE_FAILED
    assert "field 'kind'" in bad.error and "\ufffd" in bad.error, bad.error
    # The load's error, returned to the client that asks for it, is UTF-8 too.
    error = rpc_error(client.models.LoadPipeline, client.pb2.LoadPipelineRequest(name="bad-bytes"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "\ufffd" in error.details()
    listed = subprocess.run([str(cli_bin), "--server", client.address, "list"],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "bad-bytes" in listed.stdout


def test_a_broken_manifest_is_listed_as_failed_before_any_load(make_server, cli_bin):
    """Not only after a load tried it: ListPipelines shows a pipeline whose manifest does not
    parse as failed, with the manifest's error, not as available with an empty kind."""
    client = make_server(load="tiny", setup=add_broken)
    broken = client.pipelines()["broken"]
    assert broken.state == client.pb2.PIPELINE_STATE_FAILED
    assert "components.unet.file" in broken.error
    listed = subprocess.run([str(cli_bin), "--server", client.address, "list"],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "failed" in next(line for line in listed.stdout.splitlines() if "broken" in line)


def test_a_component_file_of_another_role_is_refused_at_load(make_server):
    """A VAE decoder saved as unet.pt used to load and fail only at Generate with INTERNAL; its
    forward's signature is checked against the kind's contract when the pipeline loads (Note
    [Component signatures] in server/pipeline/pipeline.cpp)."""
    import shutil

    def setup(models):
        shutil.copytree(models / "tiny", models / "swapped")
        for suffix in (".pt", ".safetensors"):  # its graph and its weights
            shutil.copyfile(models / "tiny" / f"vae_decoder{suffix}",
                            models / "swapped" / f"unet{suffix}")
        drop_digests(models / "swapped")  # a manifest without them: the signature is the check

    client = make_server(setup=setup)
    assert_load_refused(client, "swapped", "components.unet.file ",
                        "swapped/unet.pt: its forward takes 1 argument(s)",
                        "a unet of kind sd takes 3 (sample, timestep, encoder_hidden_states)")
    assert_still_serving(client)


def test_a_changed_component_file_is_refused_at_load(make_server):
    """64 flipped bytes inside unet.pt used to load and generate. The manifest records the
    SHA-256 of each component's graph and weights file, checked at load (Note [File digests] in
    server/util/file_digest.h); a manifest without digests still loads (older repositories)."""
    import shutil

    def flip(path):
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
        path.write_bytes(bytes(data))

    def setup(models):
        for name in ("flipped", "flipped-weights", "undigested"):
            shutil.copytree(models / "tiny", models / name)
        drop_digests(models / "undigested")
        flip(models / "flipped" / "unet.pt")
        flip(models / "flipped-weights" / "unet.safetensors")

    client = make_server(setup=setup)
    assert_load_refused(client, "flipped", "components.unet.file ",
                        "flipped/unet.pt has SHA-256 ", "the manifest records")
    assert_load_refused(client, "flipped-weights", "components.unet.weights.file ",
                        "flipped-weights/unet.safetensors has SHA-256 ", "the manifest records")
    loaded = client.models.LoadPipeline(client.pb2.LoadPipelineRequest(name="undigested"),
                                        timeout=120)
    assert loaded.pipeline.state == client.pb2.PIPELINE_STATE_LOADED
    assert_still_serving(client)


def test_a_folder_whose_graphs_hold_their_tensors_still_serves(make_server):
    """Folders imported before graphs and weights were separate files (Note [Weights beside the
    graph] in server/component/weights_file.h) hold every tensor in the graph and name no
    weights file: they load and give the same images."""
    import re
    import shutil
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "qpool_export"))
    from qpool_export import weights_file

    def setup(models):
        folder = models / "embedded"
        shutil.copytree(models / "tiny", folder)
        for component in ("text_encoder", "unet", "vae_decoder"):
            graph = folder / f"{component}.pt"
            module = weights_file.load_component(str(graph))
            graph.unlink()
            module.save(str(graph))
            (folder / f"{component}.safetensors").unlink()
        manifest = folder / "pipeline.yaml"
        text = re.sub(r"(?m)^    weights:\n      file: \w+\.safetensors\n      sha256: \w+\n",
                      "", manifest.read_text())
        manifest.write_text(text)
        drop_digests(folder)

    client = make_server(pipelines=("tiny",), load="all", setup=setup)
    assert "safetensors" not in (client.server.repository / "embedded" / "pipeline.yaml"
                                 ).read_text()
    request = dict(prompt="a lighthouse at dusk", steps=2, seed=11)
    want = client.generate_one(pipeline="tiny", **request).images[0]
    got = client.generate_one(pipeline="embedded", **request).images[0]
    assert got == want


# Bytes that are no valid request: truncated (a string field announcing 5 bytes, holding 2),
# a string field that is not UTF-8 (field 1 = b"\xc3\x28"), and garbage.
UNPARSABLE = {"truncated": b"\x0a\x05ab", "not-utf8": b"\x0a\x02\xc3\x28",
              "garbage": b"\xff\xff\xff\xff"}


METHODS = {"/qpool.v1.InferenceService/Generate": True, "/qpool.v1.InferenceService/Encode": False,
           "/qpool.v1.ModelService/LoadPipeline": False,
           "/qpool.v1.ModelService/ListPipelines": False,
           "/qpool.v1.ModelService/WatchMemory": True}  # method: server-streaming
# ListPipelinesRequest and WatchMemoryRequest have no string field 1: the UTF-8 case parses there
# as an unknown field, as protobuf intends.
UNPARSABLE_CASES = [(m, p) for m in METHODS for p in UNPARSABLE
                    if p != "not-utf8" or "ListPipelines" not in m and "WatchMemory" not in m]


@pytest.mark.parametrize("method,payload", UNPARSABLE_CASES,
                         ids=[f"{m.rsplit('/', 1)[1]}-{p}" for m, p in UNPARSABLE_CASES])
def test_requests_that_do_not_parse_are_invalid_argument(client, method, payload):
    # Note [Requests that do not parse]: gRPC's typed handlers answered UNIMPLEMENTED with an
    # empty message.
    streaming = METHODS[method]
    call = (client.channel.unary_stream if streaming else client.channel.unary_unary)(method)
    with pytest.raises(grpc.RpcError) as raised:
        result = call(UNPARSABLE[payload], timeout=30)
        if streaming:
            list(result)
    assert raised.value.code() == INVALID, raised.value
    assert "the request is not a valid qpool.v1." in raised.value.details()
    assert_still_serving(client)


def test_unparsable_inference_requests_are_counted(client):
    from conftest import parse_samples, scrape

    def count(rpc):
        samples = parse_samples(scrape(client))
        key = ("qpool_requests_total", frozenset({("pipeline", "unknown"), ("rpc", rpc),
                                                  ("status", "INVALID_ARGUMENT")}))
        return samples.get(key, 0)

    before = {rpc: count(rpc) for rpc in ("generate", "encode")}
    for method, rpc in (("Generate", "generate"), ("Encode", "encode")):
        call = client.channel.unary_stream if rpc == "generate" else client.channel.unary_unary
        with pytest.raises(grpc.RpcError):
            result = call(f"/qpool.v1.InferenceService/{method}")(UNPARSABLE["garbage"],
                                                                  timeout=30)
            if rpc == "generate":
                list(result)
    assert {rpc: count(rpc) - before[rpc] for rpc in before} == {"generate": 1, "encode": 1}
