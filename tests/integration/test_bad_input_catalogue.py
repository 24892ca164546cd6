"""A catalogue of hostile inputs, each answered with the right status code and a message naming
what to change, after which the server is as it was: it still serves, its memory is back to the
baseline taken at the start, and no request is left in flight.

test_bad_input.py covers the everyday mistakes (steps or sizes past a limit, NaN guidance, a
path-like name); this module throws the rest at one shared server, by category:

  names          12 invalid names x 8 RPCs, a name at the length limit, 17 devices x 3 RPCs,
                 13 offload policies, offloading a CPU pipeline                    (162 cases)
  numbers        seeds, steps, sizes, image counts, guidance and schedulers at and past their
                 limits, size conditioning on a kind without it, max_events and
                 after_sequence at their type's maximum                            (29 cases)
  sizes          prompts at and past 16 KiB (bytes, not characters), odd but valid UTF-8,
                 too many Encode prompts, a message past --max-message-mb          (20 cases)
  protocol       raw bytes through a generic call: unparsable messages (INVALID_ARGUMENT with a
                 message), parsable oddities (unknown fields, wrong wire types, over-long
                 varints, one RPC's request sent to another), unknown methods      (26 cases)
  deadlines      1 ms deadlines, cancellation before and after the first event, a load
                 abandoned on its way, a channel closed mid-stream                 (8 cases)
  concurrency    Generate racing unload/load, 200 ListPipelines at once, 300 WatchMemory streams
                 opened and dropped past --max-watchers, garbage mixed with good requests
                                                                                   (4 cases)
  broken files   component files truncated, empty, foreign, a directory, a FIFO, a dangling or
                 looping or outward symbolic link, paths with '..' or absolute; manifests empty,
                 a directory, with a tab, binary, a list, too large, with aliases, linked from
                 outside; tokenizer files missing or broken; a pipeline folder linked from
                 outside                                                           (29 cases)

278 cases in all. After every case an autouse fixture checks the server: a one-step Generate on
`tiny` succeeds, qpool_pipeline_queue_depth, qpool_device_queue_depth and every pipeline's
in_flight are 0, and GetMemoryReport shows the baseline (allocated bytes per device, the loaded
pipelines and their bytes, leaked bytes, pinned host bytes, offload policies).
"""

import math
import os
import shutil
import threading
import time

import grpc
import pytest

from conftest import parse_samples, rpc_error, run_concurrently, scrape

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
OK = grpc.StatusCode.OK

MAX_PROMPT_BYTES = 16 * 1024  # the server's limit on each prompt (kMaxPromptBytes)
MAX_MESSAGE_MB = 8  # --max-message-mb of the shared server
SECRET = "TOPSECRET-4b1d-not-for-clients"  # in a file outside the repository
NOISE = bytes((i * 151 + 7) % 256 for i in range(1024))  # bytes that are no format


# ------------------------------------------------------------------ the broken repository


def drop_digests(folder):
    """The manifest in `folder` without its components' sha256 lines (older repositories), so a
    damaged file reaches the TorchScript loader instead of the digest check."""
    manifest = folder / "pipeline.yaml"
    lines = manifest.read_text().splitlines()
    manifest.write_text("".join(f"{line}\n" for line in lines if "sha256:" not in line))


def edit_manifest(folder, old, new):
    manifest = folder / "pipeline.yaml"
    text = manifest.read_text()
    assert old in text, f"{old!r} not in {manifest}"
    manifest.write_text(text.replace(old, new))


def truncate(path, keep):
    path.write_bytes(path.read_bytes()[:keep])


def replace_with_dir(path):
    path.unlink()
    path.mkdir()


def relink(path, target):
    path.unlink()
    os.symlink(target, path)


# (id, how to break a copy of tiny (folder, repository), digests kept, expected code, words the
# message must hold; "{dir}" is the broken pipeline's folder)
BROKEN_FILES = [
    ("component-truncated", lambda d, r: truncate(d / "unet.pt", 100_000), True, INVALID,
     ["{dir}/unet.pt", "SHA-256"]),
    ("component-truncated-no-digest", lambda d, r: truncate(d / "unet.pt", 100_000), False,
     INVALID, ["{dir}/unet.pt", "unet"]),
    ("component-empty", lambda d, r: truncate(d / "unet.pt", 0), False, INVALID,
     ["{dir}/unet.pt", "unet"]),
    ("component-zip-header-then-noise",
     lambda d, r: (d / "unet.pt").write_bytes(b"PK\x03\x04" + NOISE * 4), False, INVALID,
     ["{dir}/unet.pt", "unet"]),
    ("text-encoder-truncated", lambda d, r: truncate(d / "text_encoder.pt", 1000), False,
     INVALID, ["{dir}/text_encoder.pt", "text_encoder"]),
    # The last component fails after the first two were loaded: their memory must be freed.
    ("last-component-empty", lambda d, r: truncate(d / "vae_decoder.pt", 0), False, INVALID,
     ["{dir}/vae_decoder.pt", "vae_decoder"]),
    ("component-is-a-directory", lambda d, r: replace_with_dir(d / "unet.pt"), True, INVALID,
     ["{dir}/pipeline.yaml", "components.unet.file", "not a regular file"]),
    ("component-is-a-fifo", lambda d, r: ((d / "unet.pt").unlink(), os.mkfifo(d / "unet.pt")),
     True, INVALID, ["{dir}/pipeline.yaml", "components.unet.file", "not a regular file"]),
    ("component-dangling-symlink", lambda d, r: relink(d / "unet.pt", r / "nowhere.pt"), True,
     INVALID, ["{dir}/pipeline.yaml", "components.unet.file", "{dir}/unet.pt"]),
    ("component-symlink-loop", lambda d, r: relink(d / "unet.pt", d / "unet.pt"), True, INVALID,
     ["{dir}/pipeline.yaml", "components.unet.file", "{dir}/unet.pt"]),
    ("component-symlink-out-of-repository",
     lambda d, r: relink(d / "unet.pt", r.parent / "outside-unet.pt"), True, INVALID,
     ["{dir}/pipeline.yaml", "components.unet.file", "outside the model repository"]),
    ("component-path-with-dotdot",
     lambda d, r: edit_manifest(d, "file: unet.pt", "file: ../tiny/unet.pt"), True, INVALID,
     ["{dir}/pipeline.yaml", "components.unet.file", ".."]),
    ("component-path-absolute",
     lambda d, r: edit_manifest(d, "file: unet.pt", f"file: {r}/tiny/unet.pt"), True, INVALID,
     ["{dir}/pipeline.yaml", "components.unet.file", "relative"]),
    ("manifest-empty", lambda d, r: (d / "pipeline.yaml").write_bytes(b""), True, INVALID,
     ["{dir}/pipeline.yaml"]),
    ("manifest-yaml-tab",
     lambda d, r: edit_manifest(d, "\n  unet:\n", "\n\tunet:\n"), True, INVALID,
     ["{dir}/pipeline.yaml", "tab"]),
    ("manifest-binary", lambda d, r: (d / "pipeline.yaml").write_bytes(NOISE), True,
     INVALID, ["{dir}/pipeline.yaml"]),
    ("manifest-a-list", lambda d, r: (d / "pipeline.yaml").write_text("- kind\n- sd\n"), True,
     INVALID, ["{dir}/pipeline.yaml", "mapping"]),
    ("manifest-20-mib",
     lambda d, r: (d / "pipeline.yaml").write_text("kind: sd\n#" + "x" * (20 << 20) + "\n"),
     True, INVALID, ["{dir}/pipeline.yaml", "at most"]),
    ("manifest-alias-bomb", lambda d, r: (d / "pipeline.yaml").write_text(
        'a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' +
        "".join(f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]\n"
                for p, k in zip("abcdefgh", "bcdefghi")) + "kind: sd\n"),
     True, INVALID, ["{dir}/pipeline.yaml", "alias"]),
    ("latent-downscale-huge",
     lambda d, r: edit_manifest(d, "downscale: 8", "downscale: 1073741824"), True, INVALID,
     ["{dir}/pipeline.yaml", "latent.downscale", "between 1 and 64"]),
    # Sizes that are multiples of latent.downscale (the parser's check) but not of 8, which the
    # kind asks: every request without a size would be refused, so the pipeline is broken.
    ("defaults-not-a-size-of-the-kind",
     lambda d, r: (edit_manifest(d, "downscale: 8", "downscale: 4"),
                   edit_manifest(d, "  width: 64", "  width: 60")), True, INVALID,
     ["{dir}/pipeline.yaml", "defaults", "width must be a positive multiple of 8"]),
    # The manifest itself may not lead out of the repository either, and what it finds there must
    # never reach a client.
    ("manifest-symlink-out-of-repository",
     lambda d, r: relink(d / "pipeline.yaml", r.parent / "secret.txt"), True, INVALID,
     ["{dir}/pipeline.yaml", "outside the model repository"]),
    ("tokenizer-vocab-missing", lambda d, r: (d / "tokenizer" / "vocab.json").unlink(), True,
     INVALID, ["{dir}/pipeline.yaml", "tokenizer.vocab", "{dir}/tokenizer/vocab.json"]),
    ("tokenizer-merges-missing", lambda d, r: (d / "tokenizer" / "merges.txt").unlink(), True,
     INVALID, ["{dir}/pipeline.yaml", "tokenizer.merges", "{dir}/tokenizer/merges.txt"]),
    ("tokenizer-vocab-not-json", lambda d, r: (d / "tokenizer" / "vocab.json").write_text("{"),
     True, INVALID, ["{dir}/tokenizer/vocab.json", "JSON"]),
    ("tokenizer-vocab-a-list", lambda d, r: (d / "tokenizer" / "vocab.json").write_text("[1]"),
     True, INVALID, ["{dir}/tokenizer/vocab.json"]),
    ("tokenizer-vocab-is-a-directory",
     lambda d, r: replace_with_dir(d / "tokenizer" / "vocab.json"), True, INVALID,
     ["{dir}/pipeline.yaml", "tokenizer.vocab", "not a regular file"]),
    # Bytes that are not UTF-8 reach the load's error and ListPipelines: both must stay UTF-8.
    ("tokenizer-merges-line-not-utf8",
     lambda d, r: (d / "tokenizer" / "merges.txt").write_bytes(b"#version: 0.2\n\xff\xfe\xc3(\n"),
     True, INVALID, ["{dir}/tokenizer/merges.txt", "line 2"]),
    ("tokenizer-vocab-absolute",
     lambda d, r: edit_manifest(d, "vocab: tokenizer/vocab.json", f"vocab: {r}/tiny/x.json"),
     True, INVALID, ["{dir}/pipeline.yaml", "tokenizer.vocab", "relative"]),
]


def setup_repository(repository):
    """tiny (loaded), spare (a copy, not loaded), one broken copy of tiny per BROKEN_FILES case,
    a folder whose manifest is a directory, and a pipeline folder linked from outside."""
    shutil.copytree(repository / "tiny", repository / "spare")
    shutil.copyfile(repository / "tiny" / "unet.pt", repository.parent / "outside-unet.pt")
    (repository.parent / "secret.txt").write_text(f"{SECRET}\n")
    for name, damage, digests, _, _ in BROKEN_FILES:
        folder = repository / name
        shutil.copytree(repository / "tiny", folder)
        if not digests:
            drop_digests(folder)
        damage(folder, repository)
    (repository / "manifest-is-a-directory").mkdir()
    (repository / "manifest-is-a-directory" / "pipeline.yaml").mkdir()
    shutil.copytree(repository / "tiny", repository.parent / "outside-pipeline")
    os.symlink(repository.parent / "outside-pipeline", repository / "folder-linked-from-outside")


# ------------------------------------------------------------------ the server and its baseline


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny",), load="tiny", setup=setup_repository,
                       extra_args=("--max-message-mb", str(MAX_MESSAGE_MB)))


def memory_state(client):
    """What must be back after each case: allocated and pipeline bytes per device, the loaded
    pipelines with their bytes and offload policies, leaked and pinned host bytes."""
    report = client.models.GetMemoryReport(client.pb2.GetMemoryReportRequest(), timeout=30)
    policies = {name: info.offload_policy.policy for name, info in client.pipelines().items()
                if info.state == client.pb2.PIPELINE_STATE_LOADED}
    return {
        "devices": {d.device: {"allocated": d.allocated_bytes, "pipelines": d.pipeline_bytes}
                    for d in report.devices},
        "pipelines": {p.name: sum(c.weight_bytes + c.quant_state_bytes + c.other_bytes +
                                  c.graph_bytes for c in p.components)
                      for p in report.pipelines},
        "leaked_bytes_total": report.leaked_bytes_total,
        "pinned_host_bytes": report.pinned_host_bytes,
        "policies": policies,
    }


def busy(client):
    """Queue depths that are not 0 and pipelines with requests in flight."""
    samples = parse_samples(scrape(client))
    depths = {f"{name}{dict(labels)}": value for (name, labels), value in samples.items()
              if name in ("qpool_pipeline_queue_depth", "qpool_device_queue_depth") and value}
    in_flight = {name: info.in_flight for name, info in client.pipelines().items()
                 if info.in_flight}
    return depths, in_flight


def assert_recovered(client, baseline, timeout=30):
    """Nothing in flight (within `timeout` s: a cancelled request ends at its next step, which
    a busy host may delay), a tiny Generate succeeds, and memory is back to `baseline`."""
    start = time.monotonic()
    while any(busy(client)) and time.monotonic() < start + timeout:
        time.sleep(0.02)
    depths, in_flight = busy(client)
    assert not depths and not in_flight, \
        f"still in flight {time.monotonic() - start:.1f} s after the case: {depths} {in_flight}"
    result = client.generate_one(pipeline="tiny", prompt="still serving", steps=1, seed=1,
                                 timeout=60)
    assert len(result.images) == 1 and result.images[0].png.startswith(b"\x89PNG")
    assert memory_state(client) == baseline


@pytest.fixture(scope="module")
def baseline(client):
    client.generate_one(pipeline="tiny", prompt="warm-up", steps=1, seed=1)
    return memory_state(client)


@pytest.fixture(autouse=True)
def server_recovers(request):
    """After each case on the shared server: it serves, nothing is stuck, memory is back."""
    shared = None
    if "client" in request.fixturenames:
        shared = (request.getfixturevalue("client"), request.getfixturevalue("baseline"))
    yield
    if shared is not None:
        assert_recovered(*shared)


def assert_status(error, code, words=()):
    assert error.code() == code, f"{error.code()}: {error.details()}"
    for word in words:
        assert word in (error.details() or ""), (word, error.details())


def unload_quietly(client, name):
    try:
        client.models.UnloadPipeline(client.pb2.UnloadPipelineRequest(name=name), timeout=60)
    except grpc.RpcError as e:
        assert e.code() == PRECONDITION, f"{e.code()}: {e.details()}"  # not loaded


# ------------------------------------------------------------------ names

# (id, name, what of it the message quotes; None where the server shows '?' for its bytes)
BAD_NAMES = [
    ("10-kib", "n" * 10240, "n" * 64 + "..."),
    ("65-chars", "n" * 65, "'" + "n" * 65 + "'"),
    ("nul", "ti\x00ny", None),
    ("newline", "tiny\n", None),
    ("unicode", "t\u00efny", None),
    ("dotdot", "..", "'..'"),
    ("dot", ".", "'.'"),
    ("dot-prefix", ".tiny", "'.tiny'"),
    ("tilde", "~", "'~'"),
    ("space", "ti ny", "'ti ny'"),
    ("percent-encoded", "%2e%2e", "'%2e%2e'"),
    ("backslash", "..\\tiny", "..\\tiny"),
]


def name_calls(client, name):
    """Each RPC that takes a pipeline name, called with `name`."""
    pb2, models = client.pb2, client.models
    return {
        "generate": lambda: client.generate(pipeline=name, prompt="x", steps=1, timeout=30),
        "encode": lambda: client.inference.Encode(
            pb2.EncodeRequest(pipeline=name, prompts=["x"]), timeout=30),
        "load": lambda: models.LoadPipeline(pb2.LoadPipelineRequest(name=name), timeout=30),
        "unload": lambda: models.UnloadPipeline(pb2.UnloadPipelineRequest(name=name), timeout=30),
        "offload": lambda: models.OffloadPipeline(pb2.OffloadPipelineRequest(name=name),
                                                  timeout=30),
        "onload": lambda: models.OnloadPipeline(pb2.OnloadPipelineRequest(name=name), timeout=30),
        "move": lambda: models.MovePipeline(pb2.MovePipelineRequest(name=name, device="cpu"),
                                            timeout=30),
        "set-offload-policy": lambda: models.SetOffloadPolicy(pb2.SetOffloadPolicyRequest(
            name=name, policy=pb2.OffloadPolicy(policy="none")), timeout=30),
    }


NAME_RPCS = ["generate", "encode", "load", "unload", "offload", "onload", "move",
             "set-offload-policy"]


@pytest.mark.parametrize("rpc", NAME_RPCS)
@pytest.mark.parametrize("name,quoted", [c[1:] for c in BAD_NAMES], ids=[c[0] for c in BAD_NAMES])
def test_names(client, name, quoted, rpc):
    error = rpc_error(name_calls(client, name)[rpc])
    assert_status(error, INVALID, ["invalid pipeline name"] + ([quoted] if quoted else []))
    assert len(error.details()) < 1024, "the message echoes the whole name"


def test_name_at_the_length_limit_is_valid_but_unknown(client):
    name = "n" * 64
    error = rpc_error(client.models.LoadPipeline, client.pb2.LoadPipelineRequest(name=name),
                      timeout=30)
    assert_status(error, NOT_FOUND, [name])


# (id, device, expected status of LoadPipeline on spare, MovePipeline on tiny, OnloadPipeline on
# tiny (None: OK), words of the message). Nothing here names a device that can exist.
BAD_DEVICES = [
    ("cuda-99", "cuda:99", INVALID, INVALID, INVALID, ["'cuda:99'"]),
    ("gpu", "gpu", INVALID, INVALID, INVALID, ["'gpu'"]),
    ("cpu-0", "cpu:0", INVALID, INVALID, INVALID, ["'cpu:0'"]),
    ("cuda-minus-1", "cuda:-1", INVALID, INVALID, INVALID, ["'cuda:-1'"]),
    ("cuda-20-digits", "cuda:99999999999999999999", INVALID, INVALID, INVALID,
     ["'cuda:99999999999999999999'"]),
    ("cuda-colon", "cuda:", INVALID, INVALID, INVALID, ["'cuda:'"]),
    ("cuda-plus-1", "cuda:+1", INVALID, INVALID, INVALID, ["'cuda:+1'"]),
    ("cuda-hex", "cuda:0x1", INVALID, INVALID, INVALID, ["'cuda:0x1'"]),
    ("upper-case", "CPU", INVALID, INVALID, INVALID, ["'CPU'"]),
    ("leading-space", " cpu", INVALID, INVALID, INVALID, ["' cpu'"]),
    ("trailing-space", "cpu ", INVALID, INVALID, INVALID, ["'cpu '"]),
    ("nul", "cpu\x00", INVALID, INVALID, INVALID, ["device"]),
    ("list-of-cpus", "cpu,cpu", INVALID, INVALID, INVALID, ["'cpu,cpu'"]),
    ("meta", "meta", INVALID, INVALID, INVALID, ["'meta'"]),
    ("empty", "", None, INVALID, None, ["device"]),
    ("auto", "auto", None, INVALID, INVALID, ["auto"]),
    ("unicode", "cu\u064a:0", INVALID, INVALID, INVALID, ["device"]),
]


@pytest.mark.parametrize("rpc", ["load", "move", "onload"])
@pytest.mark.parametrize("device,load_code,move_code,onload_code,words",
                         [c[1:] for c in BAD_DEVICES], ids=[c[0] for c in BAD_DEVICES])
def test_devices(client, device, load_code, move_code, onload_code, words, rpc):
    pb2, models = client.pb2, client.models
    code, call = {
        "load": (load_code, lambda: models.LoadPipeline(
            pb2.LoadPipelineRequest(name="spare", device=device), timeout=60)),
        "move": (move_code, lambda: models.MovePipeline(
            pb2.MovePipelineRequest(name="tiny", device=device), timeout=60)),
        "onload": (onload_code, lambda: models.OnloadPipeline(
            pb2.OnloadPipelineRequest(name="tiny", device=device), timeout=60)),
    }[rpc]
    try:
        if code is None:
            response = call()
            assert response.pipeline.state == pb2.PIPELINE_STATE_LOADED
            assert response.pipeline.device
        else:
            assert_status(rpc_error(call), code, words)
            if rpc == "load":
                assert client.pipelines()["spare"].state != pb2.PIPELINE_STATE_LOADED
    finally:
        if rpc == "load":
            unload_quietly(client, "spare")


def set_policy(client, name, policy, **fields):
    return client.models.SetOffloadPolicy(client.pb2.SetOffloadPolicyRequest(
        name=name, policy=client.pb2.OffloadPolicy(policy=policy, **fields)), timeout=30)


# (id, pipeline, policy, OffloadPolicy fields, code, words)
BAD_POLICIES = [
    ("unknown", "tiny", "warp-drive", {}, INVALID, ["offload policy", "'warp-drive'"]),
    ("empty", "tiny", "", {}, INVALID, ["offload policy"]),
    ("upper-case", "tiny", "NONE", {}, INVALID, ["'NONE'"]),
    ("group", "tiny", "group", {}, INVALID, ["'group'", "sequential"]),
    ("idle-negative", "tiny", "idle", dict(idle_seconds=-1), INVALID, ["idle_seconds"]),
    ("idle-zero", "tiny", "idle", dict(idle_seconds=0), INVALID, ["idle_seconds"]),
    ("idle-nan", "tiny", "idle", dict(idle_seconds=math.nan), INVALID, ["idle_seconds"]),
    ("idle-inf", "tiny", "idle", dict(idle_seconds=math.inf), INVALID, ["idle_seconds"]),
    ("idle-1e300", "tiny", "idle", dict(idle_seconds=1e300), INVALID, ["idle_seconds"]),
    ("idle-past-a-week", "tiny", "idle", dict(idle_seconds=604800.5), INVALID,
     ["idle_seconds"]),
    ("sequential-not-planned-at-load", "tiny", "sequential", {}, PRECONDITION,
     ["'tiny'", "sequential"]),
    ("pipeline-not-loaded", "spare", "none", {}, PRECONDITION, ["'spare'", "load"]),
    ("pipeline-unknown", "no-such-pipeline", "none", {}, NOT_FOUND, ["'no-such-pipeline'"]),
]


@pytest.mark.parametrize("name,policy,fields,code,words", [c[1:] for c in BAD_POLICIES],
                         ids=[c[0] for c in BAD_POLICIES])
def test_offload_policies(client, name, policy, fields, code, words):
    try:
        assert_status(rpc_error(set_policy, client, name, policy, **fields), code, words)
    finally:
        set_policy(client, "tiny", "none")


def test_offload_of_a_cpu_pipeline(client):
    if client.pipelines()["tiny"].device != "cpu":
        pytest.skip("tiny is not on the CPU")
    error = rpc_error(client.models.OffloadPipeline,
                      client.pb2.OffloadPipelineRequest(name="tiny"), timeout=30)
    assert_status(error, PRECONDITION, ["'tiny'", "CPU"])


# ------------------------------------------------------------------ numbers

U32_MAX = 2**32 - 1

# (id, Generate fields, code, words); OK cases check the result echoes the value.
NUMBERS = [
    ("seed-0", dict(seed=0), OK, []),
    ("seed-2^64-1", dict(seed=2**64 - 1), OK, []),
    ("steps-0", dict(steps=0), INVALID, ["steps", "got 0"]),
    ("steps-uint32-max", dict(steps=U32_MAX), INVALID, ["steps", f"got {U32_MAX}"]),
    ("width-0", dict(width=0), INVALID, ["width", "got 0"]),
    ("width-8", dict(width=8), OK, []),
    ("height-8", dict(height=8), OK, []),
    ("width-2^31", dict(width=2**31), INVALID, ["width", f"got {2**31}"]),
    ("height-2^31", dict(height=2**31), INVALID, ["height", f"got {2**31}"]),
    ("height-uint32-max", dict(height=U32_MAX), INVALID, ["height"]),
    ("num-images-0", dict(num_images=0), INVALID, ["num_images", "got 0"]),
    ("num-images-uint32-max", dict(num_images=U32_MAX), INVALID, ["num_images"]),
    ("guidance-0", dict(guidance_scale=0.0), OK, []),
    ("guidance-1", dict(guidance_scale=1.0), OK, []),
    ("guidance-100", dict(guidance_scale=100.0), OK, []),
    ("guidance-subnormal", dict(guidance_scale=1e-45), OK, []),
    ("guidance-minus-0", dict(guidance_scale=-0.0), OK, []),
    ("guidance-100.5", dict(guidance_scale=100.5), INVALID, ["guidance_scale"]),
    ("guidance-float-max", dict(guidance_scale=3.4e38), INVALID, ["guidance_scale"]),
    ("guidance-minus-inf", dict(guidance_scale=-math.inf), INVALID, ["guidance_scale"]),
    ("guidance-negative-subnormal", dict(guidance_scale=-1e-45), INVALID, ["guidance_scale"]),
    ("true-cfg-on-sd", dict(true_cfg_scale=2.0), INVALID, ["true_cfg_scale"]),
    ("original-width-on-sd", dict(original_width=64), INVALID, ["original_width"]),
    ("crop-top-0-on-sd", dict(crop_top=0), INVALID, ["crop_top"]),
    ("target-height-uint32-max-on-sd", dict(target_height=U32_MAX), INVALID,
     ["target_height"]),
    ("scheduler-upper-case", dict(scheduler="DDIM"), INVALID, ["'DDIM'", "scheduler"]),
    ("scheduler-with-nul", dict(scheduler="ddim\x00"), INVALID, ["scheduler"]),
]


def generate_case(client, request, code, words):
    """Runs Generate with `request`: the error's code and words when `code` is not OK, else the
    result, which is returned."""
    if code != OK:
        assert_status(rpc_error(client.generate, timeout=60, **request), code, words)
        return None
    return client.generate_one(timeout=60, **request)


@pytest.mark.parametrize("fields,code,words", [c[1:] for c in NUMBERS],
                         ids=[c[0] for c in NUMBERS])
def test_numbers(client, fields, code, words):
    request = dict(pipeline="tiny", prompt="numbers", steps=1, seed=1)
    request.update(fields)
    result = generate_case(client, request, code, words)
    if result is None:
        return
    assert result.seed == request["seed"]
    image = result.images[0]
    assert (image.width, image.height) == (request.get("width", 64), request.get("height", 64))
    if "guidance_scale" in request:
        assert result.guidance_scale == pytest.approx(request["guidance_scale"], abs=1e-44)


def test_max_events_at_its_maximum(client):
    report = client.models.GetMemoryReport(client.pb2.GetMemoryReportRequest(max_events=U32_MAX),
                                           timeout=30)
    assert 1 <= len(report.events) <= 4096
    assert report.events[-1].sequence == report.last_sequence


def test_watch_memory_after_a_sequence_never_issued(client):
    """A resume point past the last event (a client resuming from another server's sequence, or
    garbage) would wait for events that never come: it is refused, naming after_sequence."""
    stream = client.models.WatchMemory(client.pb2.WatchMemoryRequest(after_sequence=2**64 - 1),
                                       timeout=2)
    assert_status(rpc_error(list, stream), grpc.StatusCode.OUT_OF_RANGE, ["after_sequence"])


# ------------------------------------------------------------------ sizes and encodings

FOX = "\U0001F98A"  # 4 bytes of UTF-8

# (id, Generate fields, code, words)
PROMPTS = [
    ("prompt-16-kib", dict(prompt="p" * MAX_PROMPT_BYTES), OK, []),
    ("prompt-16-kib-plus-1", dict(prompt="p" * (MAX_PROMPT_BYTES + 1)), INVALID,
     ["prompt", str(MAX_PROMPT_BYTES)]),
    ("prompt-4-mib", dict(prompt="p" * (4 << 20)), INVALID, ["prompt", str(MAX_PROMPT_BYTES)]),
    ("negative-prompt-16-kib-plus-1", dict(negative_prompt="n" * (MAX_PROMPT_BYTES + 1)),
     INVALID, ["negative_prompt"]),
    # The limit counts bytes: 4097 characters of 4 bytes are past it, 4096 are at it.
    ("prompt-4097-emoji", dict(prompt=FOX * 4097), INVALID, ["prompt", str(MAX_PROMPT_BYTES)]),
    ("prompt-4096-emoji", dict(prompt=FOX * 4096), OK, []),
    ("prompt-empty", dict(prompt=""), OK, []),
    ("prompt-nul-bytes", dict(prompt="a\x00b\x00\x00"), OK, []),
    ("prompt-emoji-zwj", dict(prompt="\U0001F469\u200d\U0001F469\u200d\U0001F467 " + FOX), OK,
     []),
    ("prompt-rtl", dict(prompt="\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627"), OK,
     []),
    ("prompt-combining", dict(prompt="e\u0301\u0301\u0301 Z\u0336\u0337a\u0308\u0324"), OK, []),
    ("prompt-bidi-controls-bom", dict(prompt="\ufeff\u202eabc\u202c\u200b\ufffd"), OK, []),
    ("message-past-max-message-mb", dict(prompt="p" * ((MAX_MESSAGE_MB + 1) << 20)),
     grpc.StatusCode.RESOURCE_EXHAUSTED, []),
]


@pytest.mark.parametrize("fields,code,words", [c[1:] for c in PROMPTS],
                         ids=[c[0] for c in PROMPTS])
def test_prompts(client, fields, code, words):
    request = dict(pipeline="tiny", prompt="sizes", steps=1, seed=2)
    request.update(fields)
    result = generate_case(client, request, code, words)
    if result is not None:
        assert len(result.images) == 1 and result.images[0].png.startswith(b"\x89PNG")


# (id, Encode prompts, code, words)
ENCODE_PROMPTS = [
    ("17-prompts", ["x"] * 17, INVALID, ["prompts", "17"]),
    ("100000-prompts", ["x"] * 100_000, INVALID, ["prompts", "100000"]),
    ("second-prompt-16-kib-plus-1", ["x", "p" * (MAX_PROMPT_BYTES + 1)], INVALID,
     ["prompts[1]", str(MAX_PROMPT_BYTES)]),
    ("16-prompts", ["x"] * 16, OK, []),
    ("empty-prompt", [""], OK, []),
    ("nul-prompt", ["\x00\x00"], OK, []),
    ("9-mib-of-prompts", ["p" * (1 << 20)] * (MAX_MESSAGE_MB + 1),
     grpc.StatusCode.RESOURCE_EXHAUSTED, []),
]


@pytest.mark.parametrize("prompts,code,words", [c[1:] for c in ENCODE_PROMPTS],
                         ids=[c[0] for c in ENCODE_PROMPTS])
def test_encode_prompts(client, prompts, code, words):
    request = client.pb2.EncodeRequest(pipeline="tiny", prompts=prompts)
    if code != OK:
        assert_status(rpc_error(client.inference.Encode, request, timeout=60), code, words)
        return
    reply = client.inference.Encode(request, timeout=60)
    assert reply.embeddings.shape[0] == len(prompts)
    assert list(reply.input_ids.shape)[:1] == [len(prompts)]


# ------------------------------------------------------------------ protocol garbage

LIST = "/qpool.v1.ModelService/ListPipelines"
UNLOAD = "/qpool.v1.ModelService/UnloadPipeline"
MOVE = "/qpool.v1.ModelService/MovePipeline"
MEMORY = "/qpool.v1.ModelService/GetMemoryReport"
WATCH = "/qpool.v1.ModelService/WatchMemory"
POLICY = "/qpool.v1.ModelService/SetOffloadPolicy"
GENERATE = "/qpool.v1.InferenceService/Generate"
ENCODE = "/qpool.v1.InferenceService/Encode"
STREAMING = {GENERATE, WATCH}
TINY = b"\x0a\x04tiny"  # GenerateRequest / EncodeRequest field 1 (pipeline) = "tiny"
ONE_STEP = b"\x20\x01"  # GenerateRequest field 4 (steps) = 1

# Messages no protobuf parser accepts: INVALID_ARGUMENT, with a message saying so. (Garbage, a
# length past the end and a pipeline name that is not UTF-8 are in test_bad_input.py.)
UNPARSABLE = [
    ("generate-prompt-invalid-utf8", GENERATE, TINY + b"\x12\x02\xc3\x28" + ONE_STEP),
    ("generate-prompt-overlong-utf8", GENERATE, TINY + b"\x12\x02\xc0\xaf" + ONE_STEP),
    ("generate-prompt-utf16-surrogate", GENERATE, TINY + b"\x12\x03\xed\xa0\x80" + ONE_STEP),
    ("generate-scheduler-invalid-utf8", GENERATE, TINY + ONE_STEP + b"\x52\x01\xff"),
    ("generate-varint-of-11-bytes", GENERATE, TINY + b"\x20" + b"\xff" * 10 + b"\x01"),
    ("generate-field-number-0", GENERATE, b"\x00\x01"),
    ("generate-unterminated-group", GENERATE, TINY + b"\x0b"),
    ("encode-prompt-invalid-utf8", ENCODE, TINY + b"\x12\x02\xc3\x28"),
    ("unload-name-invalid-utf8", UNLOAD, b"\x0a\x02\xc3\x28"),
    ("move-device-invalid-utf8", MOVE, TINY + b"\x12\x03cp\xff"),
    ("memory-report-truncated-varint", MEMORY, b"\x08"),
    ("watch-memory-truncated-varint", WATCH, b"\x08\x80"),
    ("set-offload-policy-truncated-submessage", POLICY, TINY + b"\x12\x05\x0a\x04no"),
]


def raw_call(client, method, data, timeout=30):
    """Sends `data` as the request of `method` without serializing; returns the raw replies."""
    if method in STREAMING:
        call = client.channel.unary_stream(method, request_serializer=None,
                                           response_deserializer=None)
        return list(call(data, timeout=timeout))
    call = client.channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    return [call(data, timeout=timeout)]


@pytest.mark.parametrize("method,data", [c[1:] for c in UNPARSABLE],
                         ids=[c[0] for c in UNPARSABLE])
def test_unparsable_requests(client, method, data):
    """Not UNIMPLEMENTED with an empty message: the method exists, the bytes are wrong."""
    error = rpc_error(raw_call, client, method, data)
    assert error.code() == INVALID, f"{error.code()}: {error.details()!r}"
    assert error.details(), "an unparsable request got no message"


def generate_replies(client, raw):
    """GenerateResponse messages of raw replies: progress events then one result."""
    replies = [client.pb2.GenerateResponse.FromString(r) for r in raw]
    assert [r.WhichOneof("event") for r in replies[:-1]] == ["progress"] * (len(replies) - 1)
    assert replies[-1].WhichOneof("event") == "result"
    return replies


def encode_reply(client, raw):
    (reply,) = raw
    return client.pb2.EncodeResponse.FromString(reply)


# Messages a protobuf parser accepts, odd as they are: (id, method, bytes, code, words, check of
# the raw replies when OK).
PARSABLE = [
    ("list-empty-body", LIST, b"", OK, [],
     lambda c, raw: "tiny" in {p.name for p in
                               c.pb2.ListPipelinesResponse.FromString(raw[0]).pipelines}),
    ("list-unknown-fields", LIST, b"\x0a\x03abc\x10\x05\xf8\x07\x01", OK, [], None),
    ("generate-empty-body", GENERATE, b"", INVALID, ["invalid pipeline name"], None),
    ("generate-unknown-field", GENERATE, TINY + ONE_STEP + b"\xf8\x07\x01", OK, [],
     lambda c, raw: len(generate_replies(c, raw)) == 2),
    # The last value of a repeated scalar field wins.
    ("generate-pipeline-field-twice", GENERATE, b"\x0a\x01x" + TINY + ONE_STEP, OK, [],
     lambda c, raw: len(generate_replies(c, raw)) == 2),
    # A known field with another wire type is kept as an unknown field: steps takes its default.
    ("generate-steps-as-bytes", GENERATE, TINY + b"\x22\x01a", OK, [],
     lambda c, raw: generate_replies(c, raw)[-1].result.steps == 4),
    ("generate-steps-as-fixed32", GENERATE, TINY + b"\x25\x01\x00\x00\x00", OK, [],
     lambda c, raw: generate_replies(c, raw)[-1].result.steps == 4),
    # A uint32 field keeps the low 32 bits of a longer varint.
    ("generate-steps-varint-2^32", GENERATE, TINY + b"\x20\x80\x80\x80\x80\x10", INVALID,
     ["steps", "got 0"], None),
    ("generate-steps-varint-minus-1", GENERATE, TINY + b"\x20" + b"\xff" * 9 + b"\x01", INVALID,
     ["steps", f"got {U32_MAX}"], None),
    # One RPC's request sent to the other: the fields line up (pipeline = 1, prompt(s) = 2).
    ("generate-request-sent-to-encode", ENCODE, TINY + b"\x12\x01x" + ONE_STEP, OK, [],
     lambda c, raw: list(encode_reply(c, raw).embeddings.shape)[:1] == [1]),
    ("encode-request-sent-to-generate", GENERATE, TINY + b"\x12\x01x\x12\x01y", OK, [],
     lambda c, raw: generate_replies(c, raw)[-1].result.images[0].png[:4] == b"\x89PNG"),
    ("unknown-method", "/qpool.v1.ModelService/DeleteEverything", b"",
     grpc.StatusCode.UNIMPLEMENTED, [], None),
    ("unknown-package", "/qpool.v2.ModelService/ListPipelines", b"",
     grpc.StatusCode.UNIMPLEMENTED, [], None),
]


@pytest.mark.parametrize("method,data,code,words,check", [c[1:] for c in PARSABLE],
                         ids=[c[0] for c in PARSABLE])
def test_parsable_oddities(client, method, data, code, words, check):
    if code != OK:
        assert_status(rpc_error(raw_call, client, method, data), code, words)
        return
    raw = raw_call(client, method, data)
    if check is not None:
        assert check(client, raw)


# ------------------------------------------------------------------ deadlines and cancellation

LONG = dict(pipeline="tiny", prompt="long", steps=50, width=256, height=256, seed=4)


def test_generate_with_a_1_ms_deadline(client):
    error = rpc_error(client.generate, timeout=0.001, **LONG)
    assert_status(error, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_encode_with_a_1_ms_deadline_behind_a_running_generate(client):
    """Alone, a 16-prompt Encode may beat a 1 ms timer on a loaded host; queued behind a running
    Generate it cannot."""
    running = client.inference.Generate(client.pb2.GenerateRequest(**LONG), timeout=60)
    try:
        assert next(running).WhichOneof("event") == "progress"
        error = rpc_error(client.inference.Encode,
                          client.pb2.EncodeRequest(pipeline="tiny", prompts=["x"] * 16),
                          timeout=0.001)
        assert_status(error, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        running.cancel()


def test_generate_cancelled_before_any_message(client):
    stream = client.inference.Generate(client.pb2.GenerateRequest(**LONG), timeout=60)
    stream.cancel()
    assert_status(rpc_error(list, stream), grpc.StatusCode.CANCELLED)


def test_generate_cancelled_after_the_first_progress(client):
    stream = client.inference.Generate(client.pb2.GenerateRequest(**LONG), timeout=60)
    assert next(stream).WhichOneof("event") == "progress"
    stream.cancel()
    assert_status(rpc_error(list, stream), grpc.StatusCode.CANCELLED)


def test_twenty_generates_cancelled_at_once(client):
    streams = [client.inference.Generate(client.pb2.GenerateRequest(**LONG), timeout=120)
               for _ in range(20)]
    deadline = time.monotonic() + 10
    while client.pipelines()["tiny"].in_flight < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.pipelines()["tiny"].in_flight == 20
    for stream in streams:
        stream.cancel()
    for stream in streams:
        assert_status(rpc_error(list, stream), grpc.StatusCode.CANCELLED)


def settle_spare(client, timeout=30):
    """Waits until no load of spare is under way (no device task queued and spare's state the
    same for 0.3 s: an abandoned request may reach the server late); returns its state."""
    deadline = time.monotonic() + timeout
    seen, since = None, time.monotonic()
    while time.monotonic() < deadline:
        samples = parse_samples(scrape(client))
        queued = sum(v for (name, _), v in samples.items() if name == "qpool_device_queue_depth")
        state = client.pipelines()["spare"].state
        if queued or state != seen:
            seen, since = state, time.monotonic()
        elif time.monotonic() - since >= 0.3:
            return state
        time.sleep(0.02)
    return seen


def load_then_unload(client, name, timeout=60):
    """Loads `name` (waiting out a load under way), then unloads it: whatever an abandoned load
    left, nothing of `name` stays."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.models.LoadPipeline(client.pb2.LoadPipelineRequest(name=name), timeout=60)
            break
        except grpc.RpcError as e:
            assert e.code() == PRECONDITION and time.monotonic() < deadline, \
                f"{e.code()}: {e.details()}"
            time.sleep(0.05)
    client.models.UnloadPipeline(client.pb2.UnloadPipelineRequest(name=name), timeout=60)


@pytest.mark.parametrize("how", ["cancel-after-20-ms", "deadline-of-1-ms"])
def test_load_abandoned_on_its_way(client, baseline, how):
    """The client gives up on a load: the pipeline ends loaded (the load finished anyway) or not,
    with memory that matches either way, and the unload gives everything back."""
    request = client.pb2.LoadPipelineRequest(name="spare")
    if how == "deadline-of-1-ms":
        error = rpc_error(client.models.LoadPipeline, request, timeout=0.001)
        assert_status(error, grpc.StatusCode.DEADLINE_EXCEEDED)
    else:
        future = client.models.LoadPipeline.future(request, timeout=60)
        time.sleep(0.02)
        if future.cancel():
            assert future.code() == grpc.StatusCode.CANCELLED
    try:
        state = settle_spare(client)
        assert state in (client.pb2.PIPELINE_STATE_LOADED, client.pb2.PIPELINE_STATE_AVAILABLE)
        memory = memory_state(client)
        if state == client.pb2.PIPELINE_STATE_LOADED:
            # Loaded: its bytes are counted once, on its device (the cpu device counts tensors).
            spare = memory["pipelines"].pop("spare")
            del memory["policies"]["spare"]
            device = client.pipelines()["spare"].device
            assert spare > 0 and memory["devices"][device]["pipelines"] >= spare
            memory["devices"][device]["pipelines"] -= spare
            if device == "cpu":
                memory["devices"][device]["allocated"] -= spare
        assert memory == baseline
    finally:
        load_then_unload(client, "spare")


def test_channel_closed_during_generate(client, pb):
    from conftest import Client

    other = Client(client.server, pb)
    stream = other.inference.Generate(client.pb2.GenerateRequest(**LONG), timeout=60)
    assert next(stream).WhichOneof("event") == "progress"
    other.close()
    error = rpc_error(list, stream)
    assert error.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), \
        f"{error.code()}: {error.details()}"


# ------------------------------------------------------------------ concurrency


def test_generate_racing_unload_and_load(client):
    """50 Generate calls spread over ~1 s while another thread unloads and loads their pipeline:
    each either completes or is refused as not loaded; unloads are refused while any is in
    flight."""
    stop = threading.Event()
    churn, unexpected = [], []

    def churner():
        requests = ((client.models.UnloadPipeline, client.pb2.UnloadPipelineRequest(name="tiny")),
                    (client.models.LoadPipeline, client.pb2.LoadPipelineRequest(name="tiny")))
        while not stop.is_set():
            for call, request in requests:
                while True:  # load always completes, so tiny is loaded when the thread stops
                    try:
                        call(request, timeout=60)
                        churn.append("ok")
                        break
                    except grpc.RpcError as e:
                        if e.code() != PRECONDITION:
                            unexpected.append(f"{e.code()}: {e.details()}")
                            break
                        if call is client.models.UnloadPipeline and stop.is_set():
                            break
                        time.sleep(0.02)
                time.sleep(0.03)

    thread = threading.Thread(target=churner)
    thread.start()
    try:
        def one(i):
            time.sleep(i * 0.02)
            return client.generate_one(pipeline="tiny", prompt=f"race {i}", steps=2, seed=i,
                                       timeout=60)

        results, errors = run_concurrently(50, one)
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not thread.is_alive(), "the unload/load thread hung"
    assert not unexpected, unexpected
    assert len(results) + len(errors) == 50
    for i, error in errors.items():
        assert error.code() == PRECONDITION, f"{i}: {error.code()}: {error.details()}"
        assert "'tiny'" in error.details() and "load" in error.details(), error.details()
    for i, result in results.items():
        assert result.seed == i and result.images[0].png.startswith(b"\x89PNG")
    assert results, "no Generate completed: the race never let one through"
    assert client.pipelines()["tiny"].state == client.pb2.PIPELINE_STATE_LOADED


def test_200_concurrent_list_pipelines(client):
    results, errors = run_concurrently(200, lambda i: client.pipelines())
    assert not errors, {i: f"{e.code()}: {e.details()}" for i, e in list(errors.items())[:5]}
    assert all("tiny" in r and "spare" in r for r in results.values())


def server_threads(client):
    with open(f"/proc/{client.server.process.pid}/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def test_watch_memory_streams_opened_and_dropped(client):
    """Three rounds of 100 streams (300 past --max-watchers' 256) opened and dropped: each
    dropped stream gives its place back, and a new one still gets the next events."""
    threads_before = server_threads(client)
    for _ in range(3):
        streams = [client.models.WatchMemory(client.pb2.WatchMemoryRequest(), timeout=60)
                   for _ in range(100)]
        client.pipelines()  # the streams are open once a later call on the channel answers
        assert not [s for s in streams if s.done()], \
            [(s.code(), s.details()) for s in streams if s.done()][:3]
        for stream in streams:
            stream.cancel()
    watch = client.models.WatchMemory(client.pb2.WatchMemoryRequest(), timeout=60)
    client.pipelines()
    client.models.LoadPipeline(client.pb2.LoadPipelineRequest(name="spare"), timeout=60)
    unload_quietly(client, "spare")
    kinds = []
    for event in watch:
        kinds.append((event.kind, event.pipeline))
        if event.kind == "unload":
            break
    watch.cancel()
    assert ("load", "spare") in kinds and kinds[-1] == ("unload", "spare"), kinds
    deadline = time.monotonic() + 10
    while server_threads(client) > threads_before + 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_threads(client) <= threads_before + 4, (threads_before, server_threads(client))


def test_garbage_mixed_with_good_requests(client):
    """60 callers at once, half of them hostile (invalid names, prompts past the limit,
    unparsable bytes): every good request completes (30 stay within tiny's queue), every bad one
    gets its own error."""
    def call(i):
        kind = i % 4
        if kind == 0:
            return client.generate_one(pipeline="tiny", prompt=f"good {i}", steps=1, seed=i,
                                       timeout=60).seed
        if kind == 1:
            return client.inference.Encode(
                client.pb2.EncodeRequest(pipeline="tiny", prompts=[f"good {i}"]),
                timeout=60).embeddings.shape[0]
        if kind == 2:
            return client.generate(pipeline="..", prompt="x" * (MAX_PROMPT_BYTES + 1), timeout=60)
        return raw_call(client, GENERATE, b"\xff\xff\xff" if i % 8 == 3 else b"\x0a\x7ftiny")

    results, errors = run_concurrently(60, call)
    good = [i for i in range(60) if i % 4 in (0, 1)]
    assert sorted(results) == good, \
        {i: f"{e.code()}: {e.details()}" for i, e in errors.items() if i % 4 in (0, 1)}
    assert all(results[i] == (i if i % 4 == 0 else 1) for i in good)
    assert {errors[i].code() for i in range(2, 60, 4)} == {INVALID}
    # Unparsable bytes: refused without disturbing the others (their code: test_unparsable_*).
    assert all(errors[i].code() != OK for i in range(3, 60, 4))


# ------------------------------------------------------------------ broken files


@pytest.mark.parametrize("name,code,words", [(c[0], c[3], c[4]) for c in BROKEN_FILES],
                         ids=[c[0] for c in BROKEN_FILES])
def test_broken_files(client, name, code, words):
    """The load fails naming the file (and the manifest's field), the pipeline is listed as
    failed with that error, Generate on it is refused, and nothing of it stays in memory."""
    folder = f"{client.server.repository}/{name}"
    error = rpc_error(client.models.LoadPipeline, client.pb2.LoadPipelineRequest(name=name),
                      timeout=120)
    assert_status(error, code, [w.format(dir=folder) for w in words])
    assert SECRET not in error.details(), "the load's error shows a file outside the repository"
    pipelines = client.pipelines()  # parses: every error in it is UTF-8
    info = pipelines[name]
    assert info.state == client.pb2.PIPELINE_STATE_FAILED
    assert info.error and SECRET not in info.error, info.error
    refused = rpc_error(client.generate, pipeline=name, prompt="x", steps=1, timeout=30)
    assert_status(refused, PRECONDITION, [f"'{name}'"])
    assert pipelines["tiny"].state == client.pb2.PIPELINE_STATE_LOADED


def test_manifest_that_is_a_directory(client):
    """A folder without a regular pipeline.yaml is not a pipeline: not listed, not found."""
    assert "manifest-is-a-directory" not in client.pipelines()
    error = rpc_error(client.models.LoadPipeline,
                      client.pb2.LoadPipelineRequest(name="manifest-is-a-directory"), timeout=30)
    assert_status(error, NOT_FOUND, ["'manifest-is-a-directory'"])


def test_pipeline_folder_linked_from_outside(client):
    """A pipeline folder that is a symbolic link out of the repository: its manifest resolves
    outside it, and the load is refused before the manifest is read."""
    name = "folder-linked-from-outside"
    error = rpc_error(client.models.LoadPipeline, client.pb2.LoadPipelineRequest(name=name),
                      timeout=60)
    assert_status(error, INVALID, [f"{name}/pipeline.yaml", "outside the model repository"])
    assert client.pipelines()[name].state == client.pb2.PIPELINE_STATE_FAILED
