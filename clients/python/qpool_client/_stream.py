"""Server streams (Generate, WatchMemory) as iterators that raise QpoolError and stop cleanly."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

import grpc
import grpc.aio

from ._errors import error_from_rpc

T = TypeVar("T")


class Stream(Generic[T]):
    """An open server stream of the sync Client. Iterate it for its messages (a failed call
    raises QpoolError, also mid-stream); cancel() ends it from any thread, after which iteration
    stops without an error; a with block cancels it on exit."""

    def __init__(self, call: Any, convert: Callable[[Any], T]):
        self._call = call
        self._convert = convert
        self._cancelled = False

    def __iter__(self) -> Stream[T]:
        return self

    def __next__(self) -> T:
        try:
            message = next(self._call)
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise error_from_rpc(e) from None
        return self._convert(message)

    def cancel(self) -> None:
        """Cancels the call (nothing happens if it has ended)."""
        self._cancelled = True
        self._call.cancel()

    close = cancel

    def __enter__(self) -> Stream[T]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.cancel()


class AsyncStream(Generic[T]):
    """An open server stream of the AsyncClient: `async for` over it (a failed call raises
    QpoolError, also mid-stream). cancel() ends it, after which iteration stops without an
    error; cancelling the task that awaits it cancels the call; an async with block cancels it on
    exit."""

    def __init__(self, call: Any, convert: Callable[[Any], T]):
        self._call = call
        self._convert = convert
        self._cancelled = False

    def __aiter__(self) -> AsyncStream[T]:
        return self

    async def __anext__(self) -> T:
        try:
            message = await self._call.read()
        except asyncio.CancelledError:
            # grpc.aio raises CancelledError from a call cancelled locally: after our cancel()
            # that is the end of the stream, unless this task is being cancelled as well.
            task = asyncio.current_task()
            cancelling = getattr(task, "cancelling", lambda: 0)()
            if self._cancelled and not cancelling:
                raise StopAsyncIteration from None
            self._call.cancel()
            raise
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                raise StopAsyncIteration from None
            raise error_from_rpc(e) from None
        if message is grpc.aio.EOF:
            raise StopAsyncIteration
        return self._convert(message)

    def cancel(self) -> None:
        """Cancels the call (nothing happens if it has ended)."""
        self._cancelled = True
        self._call.cancel()

    async def __aenter__(self) -> AsyncStream[T]:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        self.cancel()


def unchanged(message: T) -> T:
    """The conversion of streams whose messages are returned as they are (WatchMemory)."""
    return message
