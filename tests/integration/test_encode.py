"""InferenceService/Encode: the text encoder alone."""

import math
import struct

import grpc
import pytest

from conftest import rpc_error

MAX_LENGTH = 77


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny",), load="tiny")


def encode(client, *prompts):
    return client.inference.Encode(client.pb2.EncodeRequest(pipeline="tiny", prompts=list(prompts)),
                                   timeout=120)


def floats(tensor):
    return struct.unpack(f"<{len(tensor.data) // 4}f", tensor.data)


def rows(tensor, per_row_bytes):
    return [tensor.data[i:i + per_row_bytes] for i in range(0, len(tensor.data), per_row_bytes)]


def test_shapes_and_dtypes(client):
    pb2 = client.pb2
    response = encode(client, "a photo of a cat", "a dog")
    emb, ids = response.embeddings, response.input_ids
    assert len(emb.shape) == 3
    n, length, hidden = emb.shape
    assert (n, length) == (2, MAX_LENGTH) and hidden > 0
    assert emb.dtype == pb2.DTYPE_FLOAT32
    assert len(emb.data) == n * length * hidden * 4
    assert list(ids.shape) == [2, MAX_LENGTH]
    assert ids.dtype == pb2.DTYPE_INT64
    assert len(ids.data) == 2 * MAX_LENGTH * 8
    assert response.device, "device is empty"
    values = floats(emb)
    assert all(math.isfinite(v) for v in values)
    assert any(v != 0 for v in values)


def test_token_ids_are_valid(client):
    ids = encode(client, "a photo of a cat").input_ids
    values = struct.unpack(f"<{MAX_LENGTH}q", ids.data)
    assert all(v >= 0 for v in values)
    assert len(set(values)) > 2, "prompt tokens missing from input_ids"


def test_same_prompt_same_embedding(client):
    a = encode(client, "a red apple")
    b = encode(client, "a red apple")
    assert a.embeddings.data == b.embeddings.data
    assert a.input_ids.data == b.input_ids.data
    # ... also within one batch.
    both = encode(client, "a red apple", "a red apple")
    row_bytes = len(both.embeddings.data) // 2
    first, second = rows(both.embeddings, row_bytes)
    assert first == second
    ab = [x - y for x, y in zip(struct.unpack(f"<{row_bytes // 4}f", first), floats(a.embeddings))]
    assert max(abs(v) for v in ab) < 1e-4, "batched encoding differs from single encoding"


def test_different_prompts_differ(client):
    response = encode(client, "a red apple", "a rocket launch at night")
    first, second = rows(response.embeddings, len(response.embeddings.data) // 2)
    assert first != second
    ids_first, ids_second = rows(response.input_ids, MAX_LENGTH * 8)
    assert ids_first != ids_second


def test_unknown_pipeline_is_not_found(client):
    import grpc

    error = rpc_error(client.inference.Encode,
                      client.pb2.EncodeRequest(pipeline="no-such-pipeline", prompts=["x"]))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "no-such-pipeline" in error.details()


@pytest.mark.parametrize("dtype, width, numpy_dtype", [
    ("DTYPE_BFLOAT16", 2, None), ("DTYPE_FLOAT16", 2, "<f2"), ("DTYPE_FLOAT32", 4, "<f4")])
def test_reply_dtype_casts_the_float32_states(client, dtype, width, numpy_dtype):
    """EncodeRequest.dtype: the embeddings cast from the float32 reply's (round to nearest
    even), the token ids unchanged."""
    import numpy as np

    pb2 = client.pb2
    prompts = ["a photo of a cat", "a dog"]
    full = encode(client, *prompts)
    reply = client.inference.Encode(pb2.EncodeRequest(pipeline="tiny", prompts=prompts,
                                                      dtype=getattr(pb2, dtype)), timeout=120)
    assert reply.embeddings.dtype == getattr(pb2, dtype)
    assert list(reply.embeddings.shape) == list(full.embeddings.shape)
    assert len(reply.embeddings.data) == len(full.embeddings.data) // 4 * width
    assert reply.input_ids == full.input_ids
    values = np.frombuffer(full.embeddings.data, dtype="<f4")
    if numpy_dtype is None:  # bfloat16: float32's top half, rounded to nearest even
        bits = values.view("<u4").astype(np.uint64)
        want = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()
    else:
        want = values.astype(numpy_dtype).tobytes()
    assert reply.embeddings.data == want


@pytest.mark.parametrize("dtype", [4, 42])  # DTYPE_INT64, and a value the server does not know
def test_reply_dtype_other_than_floating_is_invalid(client, dtype):
    error = rpc_error(client.inference.Encode, client.pb2.EncodeRequest(
        pipeline="tiny", prompts=["x"], dtype=dtype))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "field 'dtype' is" in error.details()


CROSS_CHECK_PROMPTS = [
    "a photo of an astronaut riding a horse on mars",
    "  A   Photo\tof a CAT!!  ",
    "it's a dog's life, isn't it? we'll see; they've 2 cats & 13 birds.",
    "ünïcödé café, Ελληνικά, русский, 東京タワー, emoji 🦊🔥",
    "highly detailed, 8k, trending on artstation, " * 12,  # longer than 77 tokens: truncated
    "",
]


def test_server_tokens_and_embeddings_match_the_python_reference(client, source_repository):
    """The C++ tokenizer and text-encoder path against the exporter's Python reference
    tokenizer and the same TorchScript file run by PyTorch: ids equal, embeddings close."""
    import os
    import sys

    torch = pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "qpool_export"))
    from qpool_export.bpe import ClipTokenizer

    tiny = os.path.join(str(source_repository), "tiny")
    # The server does no HTML unescaping (see clip_tokenizer.cpp); compare like with like.
    reference = ClipTokenizer(os.path.join(tiny, "tokenizer", "vocab.json"),
                              os.path.join(tiny, "tokenizer", "merges.txt"), unescape_html=False)
    response = encode(client, *CROSS_CHECK_PROMPTS)
    n = len(CROSS_CHECK_PROMPTS)
    server_ids = struct.unpack(f"<{n * MAX_LENGTH}q", response.input_ids.data)
    for i, prompt in enumerate(CROSS_CHECK_PROMPTS):
        expected = reference.encode_padded(prompt)
        assert list(server_ids[i * MAX_LENGTH:(i + 1) * MAX_LENGTH]) == expected, prompt

    if response.device != "cpu":
        pytest.skip("embedding comparison is for the CPU (float32) server")
    import sys
    import warnings

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "qpool_export"))
    from qpool_export import weights_file

    with warnings.catch_warnings():  # TorchScript's deprecation notice
        warnings.simplefilter("ignore", DeprecationWarning)
        encoder = weights_file.load_component(os.path.join(tiny, "text_encoder.pt"))
    with torch.inference_mode():
        ids = torch.tensor(server_ids, dtype=torch.int64).view(n, MAX_LENGTH)
        expected = encoder(ids).float()
    got = torch.tensor(floats(response.embeddings)).view(expected.shape)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5), (got - expected).abs().max()


def test_prompts_larger_than_generate_allows_are_refused_before_any_work(client):
    """One prompt size limit for every RPC: Generate's 16 KiB, checked before the request is
    queued (a 60 MiB prompt used to be tokenized on the worker, delaying other requests)."""
    huge = "a fox " * (200 * 1024)  # 1.2 MB
    error = rpc_error(client.inference.Encode,
                      client.pb2.EncodeRequest(pipeline="tiny", prompts=["ok", huge]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompts[1] must be at most 16384 bytes" in error.details()
    edge = client.inference.Encode(
        client.pb2.EncodeRequest(pipeline="tiny", prompts=["x" * 16384]), timeout=60)
    assert edge.embeddings.shape[0] == 1
