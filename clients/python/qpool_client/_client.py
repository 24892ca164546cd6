"""Client: the blocking client of qpool-server, over one grpcio channel."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from . import _convert
from ._channel import DEFAULT_TIMEOUT, Connection, PemSource
from ._errors import QpoolError, error_from_rpc
from ._proto import qpool_pb2 as pb2
from ._proto import qpool_pb2_grpc as pb2_grpc
from ._stream import Stream, unchanged
from ._types import Encoding, GenerateResult, Progress, TensorDType

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._types import GenerateOptions

R = TypeVar("R")


class Client:
    """A blocking client of one qpool-server.

    `target` is "host:port" (any grpcio target). `token` is sent as `authorization: Bearer
    <token>` on every call (docs/security.md; send it over TLS only). TLS is used when `tls`
    is true or a certificate is given: `root_certificates` (PEM bytes or a file path; None: the
    system's CAs), `certificate_chain` and `private_key` for mTLS, `server_name` to check the
    server's certificate for another name than the target's. `timeout` is the default deadline
    of each call in seconds (None: none), which a call's own `timeout` replaces; memory
    watches have none unless given. `options` are more grpcio channel options.

    Methods raise QpoolError subclasses (NotFound, InvalidArgument, ...) for failed calls.
    Management calls return the generated qpool.v1 messages (qpool_client.pb2), typed and in
    step with the proto. Safe to use from several threads, like the grpcio channel under it.
    """

    def __init__(self, target: str = "127.0.0.1:50051", *, token: str | None = None,
                 tls: bool = False, root_certificates: PemSource | None = None,
                 certificate_chain: PemSource | None = None,
                 private_key: PemSource | None = None, server_name: str | None = None,
                 timeout: float | None = DEFAULT_TIMEOUT,
                 options: Sequence[tuple[str, Any]] = ()):
        self._connection = Connection.make(
            target, token=token, tls=tls, root_certificates=root_certificates,
            certificate_chain=certificate_chain, private_key=private_key,
            server_name=server_name, options=options)
        self.target = target
        self.timeout = timeout
        self._channel = self._connection.open(grpc)
        self._inference = pb2_grpc.InferenceServiceStub(self._channel)
        self._models = pb2_grpc.ModelServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Closes the channel; calls still running are cancelled."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _call(self, method: Callable[..., R], request: Any, timeout: float | None) -> R:
        try:
            return method(request, timeout=self._timeout(timeout),
                          metadata=self._connection.metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    # ------------------------------------------------------------------ inference

    def generate(self, pipeline: str, prompt: str, *,
                 on_progress: Callable[[Progress], object] | None = None,
                 timeout: float | None = None,
                 **options: Unpack[GenerateOptions]) -> GenerateResult:
        """Generates images with `pipeline` (GenerateOptions lists the options; unset ones take
        the pipeline's defaults). `on_progress` is called with each step's Progress, in this
        thread; an exception it raises cancels the request and propagates."""
        result = None
        with self.generate_stream(pipeline, prompt, timeout=timeout, **options) as stream:
            for item in stream:
                if isinstance(item, GenerateResult):
                    result = item
                elif on_progress is not None:
                    on_progress(item)
        if result is None:
            raise QpoolError(grpc.StatusCode.UNKNOWN, "the Generate stream ended without a result")
        return result

    def generate_stream(self, pipeline: str, prompt: str, *, timeout: float | None = None,
                        **options: Unpack[GenerateOptions]) -> Stream[Progress | GenerateResult]:
        """Starts a generation and returns its stream: a Progress per step, then the
        GenerateResult. Cancel it (or leave its with block) to cancel the request."""
        request = _convert.generate_request(pipeline, prompt, options)
        call = self._inference.Generate(request, timeout=self._timeout(timeout),
                                        metadata=self._connection.metadata)
        return Stream(call, _convert.event)

    def encode(self, pipeline: str, prompts: str | Sequence[str], *,
               dtype: TensorDType = "float32", timeout: float | None = None) -> Encoding:
        """Runs the pipeline's text encoders on `prompts`; floating outputs come as `dtype`
        ("float32", "bfloat16" or "float16"; token ids are int64)."""
        request = _convert.encode_request(pipeline, prompts, dtype)
        return _convert.encoding(self._call(self._inference.Encode, request, timeout))

    # ------------------------------------------------------------------ pipelines

    def list_pipelines(self, *, timeout: float | None = None) -> list[pb2.PipelineInfo]:
        """Every pipeline of the model repository, loaded or not."""
        reply = self._call(self._models.ListPipelines, pb2.ListPipelinesRequest(), timeout)
        return list(reply.pipelines)

    def load(self, name: str, device: str = "", *,
             timeout: float | None = None) -> pb2.LoadPipelineResponse:
        """Loads a pipeline ("" device: the server's choice); already_loaded says if it was."""
        return self._call(self._models.LoadPipeline,
                          pb2.LoadPipelineRequest(name=name, device=device), timeout)

    def unload(self, name: str, *, timeout: float | None = None) -> pb2.UnloadPipelineResponse:
        return self._call(self._models.UnloadPipeline, pb2.UnloadPipelineRequest(name=name),
                          timeout)

    def offload(self, name: str, *, timeout: float | None = None) -> pb2.ResidencyChange:
        """Moves every component of a GPU pipeline to pinned host memory."""
        return self._call(self._models.OffloadPipeline, pb2.OffloadPipelineRequest(name=name),
                          timeout)

    def onload(self, name: str, device: str = "", *,
               timeout: float | None = None) -> pb2.ResidencyChange:
        """Brings an offloaded pipeline back to its device ("") or to `device`."""
        return self._call(self._models.OnloadPipeline,
                          pb2.OnloadPipelineRequest(name=name, device=device), timeout)

    def move(self, name: str, device: str, *,
             timeout: float | None = None) -> pb2.ResidencyChange:
        """Moves a loaded pipeline to `device` ("cpu", "cuda:N"), all components or none."""
        return self._call(self._models.MovePipeline,
                          pb2.MovePipelineRequest(name=name, device=device), timeout)

    def set_offload_policy(self, name: str, policy: str, idle_seconds: float | None = None, *,
                           timeout: float | None = None) -> pb2.SetOffloadPolicyResponse:
        """Sets the policy ("none", "model", "idle" with idle_seconds, "sequential")."""
        request = _convert.offload_policy_request(name, policy, idle_seconds)
        return self._call(self._models.SetOffloadPolicy, request, timeout)

    # ------------------------------------------------------------------ memory

    def memory_report(self, max_events: int = 0, *,
                      timeout: float | None = None) -> pb2.MemoryReport:
        """Per-device and per-pipeline bytes, with the `max_events` most recent memory events;
        its last_sequence is where watch_memory resumes."""
        return self._call(self._models.GetMemoryReport,
                          pb2.GetMemoryReportRequest(max_events=max_events), timeout)

    def watch_memory(self, after_sequence: int = 0, *,
                     timeout: float | None = None) -> Stream[pb2.MemoryEvent]:
        """Memory events as they happen, after `after_sequence` (0: new ones only), until the
        stream is cancelled (from any thread) or `timeout` seconds pass (None: no deadline)."""
        call = self._models.WatchMemory(pb2.WatchMemoryRequest(after_sequence=after_sequence),
                                        timeout=timeout, metadata=self._connection.metadata)
        return Stream(call, unchanged)

    def empty_cache(self, device: str = "", *,
                    timeout: float | None = None) -> pb2.EmptyCacheResponse:
        """Releases the caching allocator's unused memory on `device` ("": every device)."""
        return self._call(self._models.EmptyCache, pb2.EmptyCacheRequest(device=device),
                          timeout)

    def allocator_snapshot(self, *, timeout: float | None = None) -> bytes:
        """The CUDA caching allocator's snapshot, a pickle for pytorch.org/memory_viz
        (FailedPrecondition on a machine without CUDA)."""
        reply = self._call(self._models.GetAllocatorSnapshot,
                           pb2.GetAllocatorSnapshotRequest(), timeout)
        return reply.pickle

    def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING" (draining) or "UNKNOWN"."""
        reply = self._call(self._health.Check, health_pb2.HealthCheckRequest(service=service),
                           timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
