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

237 cases in all; deadlines, cancellation and concurrency are test_hostile_clients.py's, broken
model repositories test_broken_repository.py's. After every case an autouse fixture checks the server: a one-step Generate on
`tiny` succeeds, qpool_pipeline_queue_depth, qpool_device_queue_depth and every pipeline's
in_flight are 0, and GetMemoryReport shows the baseline (allocated bytes per device, the loaded
pipelines and their bytes, leaked bytes, pinned host bytes, offload policies).
"""

import math

import grpc
import pytest

from catalogue import (ENCODE, GENERATE, INVALID, LIST, MAX_PROMPT_BYTES, MEMORY, MOVE,
                       NOT_FOUND, OK, ONE_STEP, POLICY, PRECONDITION, TINY, UNLOAD, WATCH,
                       assert_status, raw_call, setup_spare, unload_quietly)
from catalogue import baseline, server_recovers  # noqa: F401 (fixtures)
from conftest import rpc_error

MAX_MESSAGE_MB = 8  # --max-message-mb of the shared server


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny",), load="tiny", setup=setup_spare,
                       extra_args=("--max-message-mb", str(MAX_MESSAGE_MB)))


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
