"""Which pool a stream's request is for, when one picker serves several InferencePools.

The gateway names the pool on the ext_proc stream itself: its route sets the gRPC metadata `x-llm-d-inference-pool`
(`namespace/name`) through Envoy's per-route `ExtProcPerRoute.overrides.grpc_initial_metadata`, so each route's
streams carry their pool and a client, who sets only HTTP headers, cannot choose another. The router reads it once
per stream, before the first message, and hands the stream the pipeline of that pool's director (its endpoints,
failure mode, objectives and scheduling profile).

A stream whose pool cannot be told (no metadata, a pool this picker does not serve, or one that is gone) gets the
pool-less failure mode's answer: never an endpoint of another pool. `FailClose` (the default) answers 503, `Reject`
400; both with `x-llm-d-request-dropped-reason: rejected-unknown-pool`. With --serve-models-list, such a stream's
`GET /v1/models` is the aggregate: the union of every pool's models (`aggregate`), as a route for that path alone
names no pool.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from epp import wire
from epp.datastore.pools import pool_key, split_key
from epp.director.decision import Decision, Timing
from epp.director.pipeline import AnswerFn, DecisionPipeline
from epp.errors import EppError, ErrorCode
from epp.requests import InferenceRequest

log = logging.getLogger(__name__)


class PoolLessMode(enum.Enum):
    """What a request whose pool cannot be told gets (`--pool-less-failure-mode`)."""

    FAIL_CLOSE = "FailClose"  # 503: the gateway's configuration is at fault, as a pool without endpoints
    REJECT = "Reject"  # 400: the request is refused as malformed

    @property
    def code(self) -> ErrorCode:
        return ErrorCode.SERVICE_UNAVAILABLE if self is PoolLessMode.FAIL_CLOSE else ErrorCode.BAD_REQUEST


class PoolRoute(NamedTuple):
    """What a stream of one pool uses: its director's pipeline and the observer that counts it under the pool."""

    pipeline: DecisionPipeline
    observer: Any


def _no_booking(decision: Decision, timing: Timing | None = None) -> None:
    pass


def _refusing(error: EppError, clock: Callable[[], float]) -> DecisionPipeline:
    """A pipeline that answers every request with `error` (no stage waits: the adapter decides at once)."""

    def refuse(_request: InferenceRequest, _subset: Sequence[str] | None) -> Decision:
        raise error

    return DecisionPipeline(refuse, _no_booking, clock)


class PoolRouter:
    """Per stream, the route of the pool its metadata names (`route_of(key)`: None when the picker does not serve
    that pool now), or the pool-less refusal."""

    def __init__(
        self,
        route_of: Callable[[str], PoolRoute | None],
        default_namespace: str,
        mode: PoolLessMode,
        observer: Any,
        clock: Callable[[], float],
        aggregate: AnswerFn | None = None,
    ) -> None:
        """`aggregate`: the answer of a stream that names no pool to the requests the picker answers itself (the
        union of the pools' models); None: every such stream is refused."""
        self._route_of = route_of
        self._namespace = default_namespace
        self.mode = mode
        code = mode.code
        unnamed = _refusing(
            EppError(code, f"the gateway named no InferencePool ({wire.POOL_METADATA})", wire.REJECTED_UNKNOWN_POOL),
            clock,
        )
        self._unnamed = PoolRoute(unnamed.answering(aggregate) if aggregate is not None else unnamed, observer)
        self._observer = observer
        self._clock = clock
        self._warned_unnamed = False
        self._unknown: dict[str, PoolRoute] = {}  # keys the gateway named that are not served: few (route-set)

    @property
    def pool_less(self) -> PoolRoute:
        """The route of a stream that names no pool."""
        return self._unnamed

    def key_of(self, metadata: Iterable[tuple[str, Any]] | None) -> str | None:
        """The pool key the stream's metadata names (normalised to `namespace/name`), or None."""
        for name, value in metadata or ():
            if name == wire.POOL_METADATA:
                text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
                text = text.strip()
                if text:
                    return pool_key(*split_key(text, self._namespace))
        return None

    def route(self, metadata: Iterable[tuple[str, Any]] | None) -> PoolRoute:
        key = self.key_of(metadata)
        if key is None:
            if not self._warned_unnamed:
                self._warned_unnamed = True
                log.warning("an ext_proc stream names no pool (%s): answered %s", wire.POOL_METADATA, self.mode.value)
            return self._unnamed
        route = self._route_of(key)
        if route is not None:
            return route
        refusal = self._unknown.get(key)
        if refusal is None:
            error = EppError(self.mode.code, f"this picker serves no InferencePool {key}", wire.REJECTED_UNKNOWN_POOL)
            refusal = PoolRoute(_refusing(error, self._clock), self._observer)
            if len(self._unknown) < 64:  # bounded whatever the gateway sends
                self._unknown[key] = refusal
                log.warning(
                    "an ext_proc stream names pool %s, which this picker does not serve: answered %s",
                    key,
                    self.mode.value,
                )
        return refusal
