"""The kit's own messages on a child's pipe; each child adds its own typed messages beside them.

Every message is a frozen dataclass, pickled by `multiprocessing.connection.Connection` (one transport for every
child): a field has a name, not a position in a tuple.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Start:
    """Parent → child, first: what the child needs to start (opaque to the kit) and the parent's log level."""

    payload: Any
    log_level: int


@dataclass(frozen=True, slots=True)
class Ready:
    """Child → parent: started (a worker has bound its port): the start timeout ends, the heartbeat rule begins."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Child → parent, when the child has sent nothing else for `HEARTBEAT_S`: its loop still runs."""


@dataclass(frozen=True, slots=True)
class Log:
    """Child → parent: one log record (epp.observability.relay), re-emitted by the parent's loggers."""

    record: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Stop:
    """Parent → child: finish (drain what is open) and exit 0."""
