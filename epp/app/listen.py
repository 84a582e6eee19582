"""Binding the picker's gRPC servers: one clear refusal for a port that cannot be had, and the names the
self-signed certificate carries."""

from __future__ import annotations

import grpc

from epp.errors import ConfigError


def hostnames(bind_address: str) -> tuple[str, ...]:
    """Names the self-signed certificate carries (nothing verifies it; kept truthful for humans reading it)."""
    names = ["localhost", "127.0.0.1"]
    if bind_address not in ("0.0.0.0", "::", "", *names):
        names.append(bind_address)
    return tuple(names)


def bind(
    server: grpc.aio.Server, host: str, port: int, flag: str, credentials: grpc.ServerCredentials | None = None
) -> None:
    """Listen on host:port, or raise ConfigError naming the flag (the port is in use, or the address is not ours)."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if credentials is not None:
            bound = server.add_secure_port(address, credentials)
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0 and port != 0:
        raise ConfigError(f"{flag} {port}: cannot listen on {address} (in use?)")
