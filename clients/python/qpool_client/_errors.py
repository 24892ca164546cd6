"""Failed RPCs as exceptions: QpoolError and one subclass per gRPC status code.

The server's status message says what to change (proto/qpool/v1/qpool.proto lists the codes
it answers); it is the exception's `details`.
"""

from __future__ import annotations

import grpc


class QpoolError(Exception):
    """An RPC that failed: `code` is its grpc.StatusCode, `details` the server's message."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, code: grpc.StatusCode, details: str, debug_error_string: str = ""):
        super().__init__(code, details)
        self.code = code
        self.details = details
        self.debug_error_string = debug_error_string  # grpcio's diagnostics, for bug reports

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


class InvalidArgument(QpoolError):
    """A bad request field (steps, size, guidance, name, ...)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(QpoolError):
    """No pipeline of that name in the model repository."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(QpoolError):
    """The pipeline is not loaded, busy when unloading, or the call does not apply to it."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(QpoolError):
    """Out of device memory, or the pipeline's queue is full (retry later)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(QpoolError):
    """Server unreachable, shutting down, or the pipeline is being moved (retry)."""

    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(QpoolError):
    """The call needs a valid bearer token (Client(token=...))."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(QpoolError):
    """The client certificate is not allowed to make the call."""

    code = grpc.StatusCode.PERMISSION_DENIED


class DeadlineExceeded(QpoolError):
    """The call's timeout passed."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(QpoolError):
    """The call was cancelled."""

    code = grpc.StatusCode.CANCELLED


class Internal(QpoolError):
    """A server bug or a broken component file."""

    code = grpc.StatusCode.INTERNAL


class OutOfRange(QpoolError):
    """A value past what the server has, e.g. a WatchMemory sequence from before a restart."""

    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(QpoolError):
    """The server does not have this RPC (an older qpool-server)."""

    code = grpc.StatusCode.UNIMPLEMENTED


_BY_CODE: dict[grpc.StatusCode, type[QpoolError]] = {
    cls.code: cls for cls in QpoolError.__subclasses__()}


def error_from_rpc(error: grpc.RpcError) -> QpoolError:
    """The QpoolError subclass of a failed call's status code (QpoolError itself for codes
    without one, e.g. UNKNOWN)."""
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    details = error.details() if callable(getattr(error, "details", None)) else str(error)
    debug = getattr(error, "debug_error_string", None)
    return _BY_CODE.get(code, QpoolError)(code, details or "",
                                          debug() if callable(debug) else "")
