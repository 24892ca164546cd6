"""Connection settings shared by Client and AsyncClient: TLS credentials, channel options and
the bearer token (docs/security.md)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any, Union

import grpc

# Seconds; a load or a long generation may take minutes.
DEFAULT_TIMEOUT = 300.0
PemSource = Union[bytes, str, os.PathLike[str]]  # PEM bytes, or the path of a PEM file
# Generated images and encoder outputs (an LLM's hidden states of every layer) can pass grpcio's
# default of 4 MiB; 512 MiB, as the qpool CLI.
MAX_RECEIVE_BYTES = 512 << 20


def _read_pem(source: PemSource | None) -> bytes | None:
    if source is None or isinstance(source, bytes):
        return source
    with open(source, "rb") as f:
        return f.read()


@dataclasses.dataclass(frozen=True)
class Connection:
    """How to reach a server: target, credentials (None: plaintext), options, call metadata."""

    target: str
    credentials: grpc.ChannelCredentials | None
    options: list[tuple[str, Any]]
    metadata: tuple[tuple[str, str], ...]

    @classmethod
    def make(cls, target: str, *, token: str | None, tls: bool,
             root_certificates: PemSource | None, certificate_chain: PemSource | None,
             private_key: PemSource | None, server_name: str | None,
             options: Sequence[tuple[str, Any]]) -> Connection:
        """TLS when `tls` or any certificate is given: root_certificates (None: the system's
        CAs), certificate_chain and private_key for mTLS; server_name overrides the name the
        server's certificate must have."""
        if (certificate_chain is None) != (private_key is None):
            raise ValueError("mTLS needs both certificate_chain and private_key")
        secure = tls or root_certificates is not None or certificate_chain is not None
        credentials = None
        if secure:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_pem(root_certificates),
                private_key=_read_pem(private_key),
                certificate_chain=_read_pem(certificate_chain))
        elif server_name is not None:
            raise ValueError("server_name applies to TLS only (pass tls=True or "
                             "root_certificates)")
        channel_options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)]
        if server_name is not None:
            channel_options.append(("grpc.ssl_target_name_override", server_name))
        channel_options += list(options)
        metadata: tuple[tuple[str, str], ...] = ()
        if token is not None:
            token = token.strip()  # as read from a file, with its newline
            if not token or any(c.isspace() for c in token):
                raise ValueError("token must be one bearer token, without spaces")
            metadata = (("authorization", f"Bearer {token}"),)
        return cls(target, credentials, channel_options, metadata)

    def open(self, grpc_module: Any) -> Any:
        """A channel of `grpc_module` (grpc, or grpc.aio: the same two functions)."""
        if self.credentials is None:
            return grpc_module.insecure_channel(self.target, options=self.options)
        return grpc_module.secure_channel(self.target, self.credentials, options=self.options)
