"""AsyncClient: the asyncio client of qpool-server (grpc.aio), with the methods of Client."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from . import _convert
from ._channel import DEFAULT_TIMEOUT, Connection, PemSource
from ._errors import QpoolError, error_from_rpc
from ._proto import qpool_pb2 as pb2
from ._proto import qpool_pb2_grpc as pb2_grpc
from ._stream import AsyncStream, unchanged
from ._types import Encoding, GenerateResult, Progress, TensorDType

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._types import GenerateOptions

R = TypeVar("R")


class AsyncClient:
    """An asyncio client of one qpool-server: Client's arguments and methods, as coroutines.

    Make it inside a running event loop (grpc.aio binds its channel to it) and close it with
    `await client.close()` or `async with`. watch_memory and generate_stream return an
    AsyncStream at once, to iterate with `async for`.
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
        self._channel = self._connection.open(grpc.aio)
        self._inference = pb2_grpc.InferenceServiceStub(self._channel)
        self._models = pb2_grpc.ModelServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    # ------------------------------------------------------------------ lifetime

    async def close(self) -> None:
        """Closes the channel; calls still running are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()

    async def _call(self, method: Callable[..., Awaitable[R]], request: Any,
                    timeout: float | None) -> R:
        try:
            return await method(request, timeout=self._timeout(timeout),
                                metadata=self._connection.metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    # ------------------------------------------------------------------ inference

    async def generate(self, pipeline: str, prompt: str, *,
                       on_progress: Callable[[Progress], object] | None = None,
                       timeout: float | None = None,
                       **options: Unpack[GenerateOptions]) -> GenerateResult:
        """Client.generate; `on_progress` may be a plain function or a coroutine function."""
        result = None
        async with self.generate_stream(pipeline, prompt, timeout=timeout, **options) as stream:
            async for item in stream:
                if isinstance(item, GenerateResult):
                    result = item
                elif on_progress is not None:
                    returned = on_progress(item)
                    if inspect.isawaitable(returned):
                        await returned
        if result is None:
            raise QpoolError(grpc.StatusCode.UNKNOWN, "the Generate stream ended without a result")
        return result

    def generate_stream(self, pipeline: str, prompt: str, *, timeout: float | None = None,
                        **options: Unpack[GenerateOptions]
                        ) -> AsyncStream[Progress | GenerateResult]:
        """Client.generate_stream, to iterate with `async for`."""
        request = _convert.generate_request(pipeline, prompt, options)
        call = self._inference.Generate(request, timeout=self._timeout(timeout),
                                        metadata=self._connection.metadata)
        return AsyncStream(call, _convert.event)

    async def encode(self, pipeline: str, prompts: str | Sequence[str], *,
                     dtype: TensorDType = "float32", timeout: float | None = None) -> Encoding:
        """Client.encode."""
        request = _convert.encode_request(pipeline, prompts, dtype)
        return _convert.encoding(await self._call(self._inference.Encode, request, timeout))

    # ------------------------------------------------------------------ pipelines

    async def list_pipelines(self, *, timeout: float | None = None) -> list[pb2.PipelineInfo]:
        reply = await self._call(self._models.ListPipelines, pb2.ListPipelinesRequest(),
                                 timeout)
        return list(reply.pipelines)

    async def load(self, name: str, device: str = "", *,
                   timeout: float | None = None) -> pb2.LoadPipelineResponse:
        return await self._call(self._models.LoadPipeline,
                                pb2.LoadPipelineRequest(name=name, device=device), timeout)

    async def unload(self, name: str, *,
                     timeout: float | None = None) -> pb2.UnloadPipelineResponse:
        return await self._call(self._models.UnloadPipeline,
                                pb2.UnloadPipelineRequest(name=name), timeout)

    async def offload(self, name: str, *, timeout: float | None = None) -> pb2.ResidencyChange:
        return await self._call(self._models.OffloadPipeline,
                                pb2.OffloadPipelineRequest(name=name), timeout)

    async def onload(self, name: str, device: str = "", *,
                     timeout: float | None = None) -> pb2.ResidencyChange:
        return await self._call(self._models.OnloadPipeline,
                                pb2.OnloadPipelineRequest(name=name, device=device), timeout)

    async def move(self, name: str, device: str, *,
                   timeout: float | None = None) -> pb2.ResidencyChange:
        return await self._call(self._models.MovePipeline,
                                pb2.MovePipelineRequest(name=name, device=device), timeout)

    async def set_offload_policy(self, name: str, policy: str,
                                 idle_seconds: float | None = None, *,
                                 timeout: float | None = None) -> pb2.SetOffloadPolicyResponse:
        request = _convert.offload_policy_request(name, policy, idle_seconds)
        return await self._call(self._models.SetOffloadPolicy, request, timeout)

    # ------------------------------------------------------------------ memory

    async def memory_report(self, max_events: int = 0, *,
                            timeout: float | None = None) -> pb2.MemoryReport:
        return await self._call(self._models.GetMemoryReport,
                                pb2.GetMemoryReportRequest(max_events=max_events), timeout)

    def watch_memory(self, after_sequence: int = 0, *,
                     timeout: float | None = None) -> AsyncStream[pb2.MemoryEvent]:
        """Client.watch_memory, to iterate with `async for`; cancelling the task that iterates
        it cancels the call."""
        call = self._models.WatchMemory(pb2.WatchMemoryRequest(after_sequence=after_sequence),
                                        timeout=timeout, metadata=self._connection.metadata)
        return AsyncStream(call, unchanged)

    async def empty_cache(self, device: str = "", *,
                          timeout: float | None = None) -> pb2.EmptyCacheResponse:
        return await self._call(self._models.EmptyCache, pb2.EmptyCacheRequest(device=device),
                                timeout)

    async def allocator_snapshot(self, *, timeout: float | None = None) -> bytes:
        reply = await self._call(self._models.GetAllocatorSnapshot,
                                 pb2.GetAllocatorSnapshotRequest(), timeout)
        return reply.pickle

    async def health(self, service: str = "", *, timeout: float | None = None) -> str:
        reply = await self._call(self._health.Check,
                                 health_pb2.HealthCheckRequest(service=service), timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
