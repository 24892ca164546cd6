"""Between the generated qpool.v1 messages and the SDK's types (shared by both clients)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._proto import qpool_pb2 as pb2
from ._types import (Encoding, GenerateOptions, GenerateResult, Image, Progress, Tensor,
                     TensorDType, Timings)

_OPTIONS = frozenset(GenerateOptions.__annotations__)

_DTYPE_NAMES: dict[pb2.DType, TensorDType] = {
    pb2.DTYPE_FLOAT32: "float32",
    pb2.DTYPE_FLOAT16: "float16",
    pb2.DTYPE_BFLOAT16: "bfloat16",
    pb2.DTYPE_INT64: "int64",
}
_DTYPE_VALUES = {name: value for value, name in _DTYPE_NAMES.items()}
# Encode's reply dtypes (its token ids stay int64).
ENCODE_DTYPES = ("float32", "float16", "bfloat16")


def generate_request(pipeline: str, prompt: str,
                     options: Mapping[str, Any]) -> pb2.GenerateRequest:
    """A GenerateRequest; options that are None stay unset (the pipeline's defaults)."""
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TypeError(f"generate() got unknown options {unknown}; "
                        f"it takes {sorted(_OPTIONS)}")
    fields = {name: value for name, value in options.items() if value is not None}
    return pb2.GenerateRequest(pipeline=pipeline, prompt=prompt, **fields)


def event(response: pb2.GenerateResponse) -> Progress | GenerateResult:
    """One message of a Generate stream."""
    which = response.WhichOneof("event")
    if which == "progress":
        p = response.progress
        return Progress(step=p.step, total=p.total, elapsed_seconds=p.elapsed_seconds)
    if which == "result":
        return generate_result(response.result)
    raise ValueError(f"a Generate message with no known event ({which!r}): a newer server?")


def generate_result(result: pb2.GenerateResult) -> GenerateResult:
    t = result.timings
    return GenerateResult(
        images=[Image(png=i.png, width=i.width, height=i.height) for i in result.images],
        seed=result.seed, device=result.device, steps=result.steps, scheduler=result.scheduler,
        guidance_scale=result.guidance_scale, route=result.route, attempts=result.attempts,
        batch_size=result.batch_size,
        timings=Timings(queue_seconds=t.queue_seconds, encode_seconds=t.encode_seconds,
                        denoise_seconds=t.denoise_seconds, decode_seconds=t.decode_seconds,
                        total_seconds=t.total_seconds, png_seconds=t.png_seconds))


def encode_request(pipeline: str, prompts: str | Sequence[str],
                   dtype: TensorDType) -> pb2.EncodeRequest:
    if dtype not in ENCODE_DTYPES:
        raise ValueError(f"encode() dtype must be one of {ENCODE_DTYPES}, not {dtype!r}")
    listed = [prompts] if isinstance(prompts, str) else list(prompts)
    return pb2.EncodeRequest(pipeline=pipeline, prompts=listed, dtype=_DTYPE_VALUES[dtype])


def tensor(message: pb2.Tensor) -> Tensor:
    name = _DTYPE_NAMES.get(message.dtype)
    if name is None:
        raise ValueError(f"a tensor of unknown dtype {message.dtype}: a newer server?")
    return Tensor(dtype=name, shape=tuple(message.shape), data=message.data)


def encoding(reply: pb2.EncodeResponse) -> Encoding:
    def optional(field: str) -> Tensor | None:
        return tensor(getattr(reply, field)) if reply.HasField(field) else None

    return Encoding(embeddings=tensor(reply.embeddings), input_ids=tensor(reply.input_ids),
                    device=reply.device, route=reply.route,
                    pooled_embeddings=optional("pooled_embeddings"),
                    llm_embeddings=optional("llm_embeddings"),
                    llm_input_ids=optional("llm_input_ids"))


def offload_policy_request(name: str, policy: str,
                           idle_seconds: float | None) -> pb2.SetOffloadPolicyRequest:
    fields: dict[str, Any] = {"policy": policy}
    if idle_seconds is not None:
        fields["idle_seconds"] = idle_seconds
    return pb2.SetOffloadPolicyRequest(name=name, policy=pb2.OffloadPolicy(**fields))
