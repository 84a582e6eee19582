"""The ext_proc server's resource bounds: how many streams, how long a silent stream lives, how many body bytes wait.

Without them a gateway (or anyone who reaches the port) can hold memory without end: idle streams cost ~27 KB each,
and FULL_DUPLEX bodies are held until their last chunk. Each bound refuses with an ImmediateResponse, is counted
(`epp_stream_refusals_total{reason}` and `epp_requests_total`) and logged at most once per interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.errors import ConfigError

DEFAULT_MAX_STREAMS = 10_000
DEFAULT_IDLE_TIMEOUT_S = 300.0  # Envoy's own default stream_idle_timeout
DEFAULT_MAX_BUFFERED_BYTES = 256 * 1024 * 1024
# How long an ended stream waits for the peer's reset before sending its final status (see server.py, `_linger`).
# Envoy ends every ext_proc stream with END_STREAM and RST_STREAM in one write; 50 ms covers that pair under load.
DEFAULT_CLOSE_GRACE_S = 0.05


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """`--max-concurrent-streams`, `--stream-idle-timeout`, `--max-buffered-body-bytes`."""

    max_streams: int = DEFAULT_MAX_STREAMS
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    close_grace_s: float = DEFAULT_CLOSE_GRACE_S  # not a flag: a property of how gateways end their streams

    def check(self, max_body_bytes: int) -> None:
        if self.max_streams <= 0:
            raise ConfigError(f"--max-concurrent-streams must be positive, got {self.max_streams}")
        if self.idle_timeout_s <= 0:
            raise ConfigError(f"--stream-idle-timeout must be positive, got {self.idle_timeout_s}")
        if self.max_buffered_bytes < max_body_bytes:
            raise ConfigError(
                f"--max-buffered-body-bytes {self.max_buffered_bytes} is below --max-body-bytes {max_body_bytes}: "
                "a body the picker accepts could never be buffered"
            )


class BodyBudget:
    """Request-body bytes buffered across all streams of one server, against one limit. Not thread-safe."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size
