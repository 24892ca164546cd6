"""qpool_client: the Python client of qpool-server, a gRPC inference server for diffusion
pipelines.

    from qpool_client import Client

    with Client("127.0.0.1:50051") as client:
        result = client.generate("tiny", "a red fox in the snow", seed=7)
        result.images[0].save("fox.png")

Client blocks; AsyncClient has the same methods as coroutines (grpc.aio). Generate and Encode
return the dataclasses GenerateResult and Encoding; the management calls return the generated
qpool.v1 messages (`from qpool_client import pb2`). A failed call raises a QpoolError subclass
named after its gRPC status code (NotFound, InvalidArgument, ResourceExhausted, ...), also in
the middle of a stream. See README.md for TLS, tokens and memory watches.
"""

from ._aio import AsyncClient
from ._client import Client
from ._errors import (Cancelled, DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument,
                      NotFound, OutOfRange, PermissionDenied, QpoolError, ResourceExhausted,
                      Unauthenticated, Unavailable, Unimplemented)
from ._proto import qpool_pb2 as pb2
from ._stream import AsyncStream, Stream
from ._types import (Encoding, GenerateOptions, GenerateResult, Image, Progress, Tensor,
                     TensorDType, Timings)

__version__ = "0.1.0"

# Tracebacks name the public path (qpool_client.NotFound), not the private module.
for _error in (QpoolError, *QpoolError.__subclasses__()):
    _error.__module__ = __name__
del _error

__all__ = [
    "AsyncClient", "AsyncStream", "Cancelled", "Client", "DeadlineExceeded", "Encoding",
    "FailedPrecondition", "GenerateOptions", "GenerateResult", "Image", "Internal",
    "InvalidArgument", "NotFound", "OutOfRange", "PermissionDenied", "Progress", "QpoolError",
    "ResourceExhausted", "Stream", "Tensor", "TensorDType", "Timings", "Unauthenticated",
    "Unavailable", "Unimplemented", "pb2",
]
