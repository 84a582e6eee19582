"""Clients of the picker's ext_proc port, which serves TLS by default with a certificate made at start.

gRPC's Python client cannot skip certificate verification, so a test trusts what the port presents (read once, as a
gateway that does not verify would accept it) and checks the host name the self-signed certificate carries.
"""

from __future__ import annotations

import ssl

import grpc

SELF_SIGNED_NAME = "localhost"  # a name in the picker's self-signed certificate (epp.app.listen.hostnames)


def presented_certificate(port: int, host: str = "127.0.0.1") -> bytes:
    """The PEM certificate the TLS port presents now (a new connection, so after a reload it is the new one)."""
    return ssl.get_server_certificate((host, port), timeout=5).encode()


def _options() -> list[tuple[str, str]]:
    return [("grpc.ssl_target_name_override", SELF_SIGNED_NAME)]


def picker_channel(port: int, host: str = "127.0.0.1") -> grpc.Channel:
    """A blocking gRPC channel to the picker's TLS port, trusting the certificate it presents."""
    credentials = grpc.ssl_channel_credentials(root_certificates=presented_certificate(port, host))
    return grpc.secure_channel(f"{host}:{port}", credentials, options=_options())
