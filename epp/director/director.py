"""The director: from a parsed request to a decision, and the bookkeeping when the request ends.

It owns the order of the steps (candidates → scheduler → book the pick in flight) and the failure policy of the
pool: an internal failure of the scheduler never hangs or crashes a stream — under FailOpen the request still goes
to a random usable candidate (fresh metrics; any candidate when none has them yet), counted as degraded; under
FailClose it is refused with a 503. What runs before `decide` and after `complete` on the serving path (render
call, flow-control hold, eviction tracking) is the director's pipeline, `epp.director.pipeline`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np

from epp import wire
from epp.datastore import EndpointTable, Freshness, Snapshot, usable
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.pool import FailureMode
from epp.datastore.table import IntArray
from epp.director.decision import Decision
from epp.director.flow import FlowGate
from epp.director.pipeline import DecisionPipeline
from epp.director.rewrite import ModelRewriter
from epp.director.tokens import RenderTokenizer
from epp.errors import EppError, ErrorCode
from epp.federation.policy import Route
from epp.flowcontrol import QueuedRequest
from epp.flowcontrol.admission import Admitter
from epp.requests import InferenceRequest
from epp.scheduling import test_selection
from epp.scheduling.disagg import StagedPick, stage_headers, with_port
from epp.scheduling.producers import TokenProducer, estimate_tokens

log = logging.getLogger(__name__)
_NO_ENDPOINTS = wire.REJECTED_NO_ENDPOINTS  # upstream's reason when no candidate endpoint exists at all
_FRESH = Freshness()  # what FailOpen's fallback counts as a usable candidate


class Scheduler(Protocol):
    """The decision seam: pure, given a snapshot, candidate slots, the request and `now`; returns slots to try,
    best first (the rest are fallbacks). An empty result means no candidate fits."""

    def pick(
        self, snapshot: Snapshot, candidates: IntArray, request: InferenceRequest, now: float
    ) -> Sequence[int]: ...


class Federation(Protocol):
    """Residency and overflow across sites (epp.federation.policy.FederationRouter): narrows the local candidates
    to allowed tiers, or sends the request to a remote site's gateway; raises EppError 503 when nothing is allowed."""

    def route(
        self,
        snapshot: Snapshot,
        candidates: IntArray,
        models: tuple[str, ...],
        objective: str | None,
        headers: Mapping[str, str],
        now: float,
        subset: Sequence[str] | None,
    ) -> Route: ...

    def release(self, site: str) -> None: ...


class SaturationSignal(Protocol):
    """The pool's saturation (≥ 1.0 = saturated), read before admitting a sheddable request."""

    def saturation(self, snapshot: Snapshot, candidates: IntArray, now: float) -> float: ...


class DecisionObserver(Protocol):
    """What the director reports; the observability layer implements it (a no-op in unit tests)."""

    def degraded_decision(self, reason: str) -> None: ...


def render_tokenizer(scheduler: object) -> RenderTokenizer | None:
    """The render client of the scheduler's vllm token-producer, if its profile has one."""
    profile = getattr(scheduler, "profile", None)
    for producer in getattr(profile, "producers", ()):
        if isinstance(producer, TokenProducer) and producer.backend == "vllm":
            return RenderTokenizer(
                producer.url, producer.model_name, producer.timeout_s, producer.chat_timeout_s, producer.cache_size
            )
    return None


class _NullObserver:
    def degraded_decision(self, reason: str) -> None:
        pass


class Director:
    def __init__(
        self,
        table: EndpointTable,
        scheduler: Scheduler,
        clock: Callable[[], float],
        failure_mode: Callable[[], FailureMode] = lambda: FailureMode.FAIL_CLOSE,
        observer: DecisionObserver | None = None,
        objectives: ObjectiveStore | None = None,
        saturation: SaturationSignal | None = None,
        seed: int | None = None,
        federation: Federation | None = None,
        honour_subset: bool = True,
        test_selection: bool = False,
        flow: FlowGate | None = None,
    ) -> None:
        """`objectives` gives priorities and model rewrites (none: every request priority 0, no rewrite);
        `saturation` decides shedding (none: the scheduler's own `.saturation` if it has one, else no shedding);
        `seed` makes weighted rewrite choices reproducible; `honour_subset` False ignores the gateway's subset hint
        (upstream's --disable-endpoint-subset-filter); `test_selection` honours conformance's
        `test-epp-endpoint-selection` header (--enable-test-endpoint-selection; tests only); `flow` is flow
        control (the `flowControl` gate): requests wait in its queues before they get here, and the legacy shedding
        step is off."""
        self._table = table
        self._scheduler = scheduler
        self._clock = clock
        self._failure_mode = failure_mode
        self._observer = observer or _NullObserver()
        self._objectives = objectives
        if saturation is None:
            saturation = getattr(scheduler, "saturation", None)
        self._saturation = saturation
        self._rewriter = ModelRewriter(objectives, seed)
        self._federation = federation  # None: no federation, every candidate is local
        self._honour_subset = honour_subset
        self._test_selection = test_selection
        self.flow = flow
        self._admitters: tuple[Admitter, ...] = tuple(getattr(scheduler, "admitters", ()))
        self._draw = random.Random(seed)
        # Asked per request only when a plugin writes a response header (session affinity); most profiles have none.
        responds = getattr(scheduler, "writes_response_headers", True)
        self._response_headers = getattr(scheduler, "response_headers", None) if responds else None
        # The stages before `decide` (a vllm token-producer's render call, flow control's hold) and after
        # `complete`, which the ext_proc adapter runs for every stream (epp.director.pipeline).
        self.pipeline = DecisionPipeline(self.decide, self.complete, clock, render_tokenizer(scheduler), flow)

    @property
    def table(self) -> EndpointTable:
        return self._table

    def candidates(self, snapshot: Snapshot, subset: Sequence[str] | None) -> IntArray:
        """Slots that may serve: present endpoints, narrowed to the gateway's subset hint (ip:port) if given."""
        slots = snapshot.slots
        if subset is None:
            return slots
        wanted = {s.strip() for s in subset}
        by_address = snapshot.addresses
        return np.fromiter((s for s in slots if by_address[s] in wanted), dtype=np.int64)

    def decide(self, request: InferenceRequest, subset: Sequence[str] | None = None) -> Decision:
        """Choose endpoints for a request; raises EppError with the client-facing reason when it cannot."""
        snapshot = self._table.view()  # read-only live views: this method does not await
        if not self._honour_subset:
            subset = None
        if subset is not None and not subset:
            raise EppError(ErrorCode.SERVICE_UNAVAILABLE, "the gateway's endpoint subset is empty", _NO_ENDPOINTS)
        candidates = snapshot.slots if subset is None else self.candidates(snapshot, subset)
        if self._test_selection:
            named = request.headers.get(test_selection.HEADER, "").strip()
            if named:
                candidates = test_selection.selected(snapshot, candidates, named)
                if candidates.size == 0:
                    raise EppError(
                        ErrorCode.SERVICE_UNAVAILABLE, f"{test_selection.HEADER} names no pool endpoint", _NO_ENDPOINTS
                    )
        now = self._clock()
        original_model = request.model
        request, body = self._rewriter.rewrite(request)
        if self._federation is not None:
            # Residency rules apply to the client's model and to the model it is rewritten to (fail-closed).
            models = (original_model, request.model)
            route = self._federation.route(
                snapshot, candidates, models, request.objective, request.headers, now, subset
            )
            if route.site is not None:  # the client's own body goes to the site, whose picker does its own rewrite
                return Decision(
                    addresses=route.addresses,
                    slot=-1,
                    original_model=original_model,
                    target_model=original_model,
                    site=route.site,
                    headers=route.headers,
                )
            candidates = route.local
        if candidates.size == 0:
            if subset is not None:
                raise EppError(
                    ErrorCode.SERVICE_UNAVAILABLE, "no pool endpoint matches the gateway's subset hint", _NO_ENDPOINTS
                )
            if request.no_body:  # upstream's answer to a request without a body when the pool is empty
                raise EppError(ErrorCode.INTERNAL, "no pods available in datastore")
            raise EppError(ErrorCode.SERVICE_UNAVAILABLE, "no ready endpoint in the pool", _NO_ENDPOINTS)
        if self.flow is None and (self._admitters or request.objective):  # else `_admit` has nothing to do
            self._admit(request, snapshot, candidates, now)
        degraded = False
        try:
            slots = self._scheduler.pick(snapshot, candidates, request, now)
        except EppError:
            raise
        except Exception as exc:  # the scheduler is ours; a bug there must not become a broken stream
            if self._failure_mode() is FailureMode.FAIL_CLOSE:
                log.exception("scheduling failed; refusing the request (FailClose)")
                raise EppError(ErrorCode.SERVICE_UNAVAILABLE, "scheduling failed") from exc
            log.exception("scheduling failed; routing to a random candidate (FailOpen)")
            self._observer.degraded_decision("scheduler-error")
            slots = (self._fallback(snapshot, candidates, now),)
            degraded = True
        if not slots:
            raise EppError(ErrorCode.SERVICE_UNAVAILABLE, "no candidate endpoint fits the request")
        primary = int(slots[0])
        tokens = len(request.token_ids) if request.token_ids else estimate_tokens(request.prompt)
        self._table.book_pick(primary, tokens)
        addresses = snapshot.addresses
        if isinstance(slots, StagedPick):
            decision = self._staged(slots, addresses, degraded, body, original_model, request.model, tokens)
            if self._response_headers:
                decision = decision._replace(response_headers=self._response_headers(snapshot, primary))
            return decision
        return Decision(
            addresses=(addresses[primary],) if len(slots) == 1 else tuple(addresses[s] for s in slots),
            slot=primary,
            degraded=degraded,
            body=body,
            original_model=original_model,
            target_model=request.model,
            tokens=tokens,
            response_headers=self._response_headers(snapshot, primary) if self._response_headers else (),
        )

    def _fallback(self, snapshot: Snapshot, candidates: IntArray, now: float) -> int:
        """FailOpen's pick when the scheduler broke: a random candidate among those with fresh metrics (the
        usable ones), or among all of them when none is usable (never scraped yet: the pool still serves)."""
        fresh = candidates[usable(snapshot.scraped_at[candidates], snapshot.scrape_failures[candidates], now, _FRESH)]
        chosen = fresh if fresh.size else candidates
        return int(chosen[self._draw.randrange(chosen.size)])

    def _staged(
        self,
        pick: StagedPick,
        addresses: Sequence[str],
        degraded: bool,
        body: bytes | None,
        original_model: str,
        target_model: str,
        tokens: int,
    ) -> Decision:
        """A disaggregated decision: the gateway forwards to the decode endpoint; the prefill (and encode) endpoints
        travel in the headers its sidecar reads, and are booked in flight with it, released together."""
        primary = int(pick[0])
        stages = tuple((slot, addresses[slot]) for slot in pick.booked[1:])
        for slot, _ in stages:
            self._table.book_pick(slot, tokens)
        destination = tuple(addresses[int(s)] for s in pick)
        booked = ""
        if pick.primary_port:
            booked = destination[0]
            destination = tuple(with_port(a, pick.primary_port) for a in destination)
        return Decision(
            addresses=destination,
            slot=primary,
            degraded=degraded,
            body=body,
            original_model=original_model,
            target_model=target_model,
            headers=stage_headers(addresses, pick),
            tokens=tokens,
            stages=stages,
            booked=booked,
        )

    def _admit(self, request: InferenceRequest, snapshot: Snapshot, candidates: IntArray, now: float) -> None:
        """Shedding: a sheddable request (its objective's priority < 0) is refused with 429 while the pool is
        saturated. Saturation is computed only for sheddable requests, so the common path pays nothing. The
        config's admission plugins (probabilistic-admitter, latency-slo-admitter) run first."""
        if self._admitters and self._objectives is not None:
            self._run_admitters(request, snapshot, candidates, now)
        if self._objectives is None or self._saturation is None or not request.objective:
            return
        priority = self._objectives.priority_of(request.objective)
        if priority < 0 and self._saturation.saturation(snapshot, candidates, now) >= 1.0:
            raise EppError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"pool saturated: sheddable request (objective {request.objective!r}, priority {priority}) dropped",
                wire.REJECTED_SATURATED,
            )

    def _run_admitters(self, request: InferenceRequest, snapshot: Snapshot, candidates: IntArray, now: float) -> None:
        assert self._objectives is not None
        item = QueuedRequest(
            ticket=None,
            priority=self._objectives.priority_of(request.objective),
            received_at=now,
            slo_ttft_s=request.slo_ttft_ms / 1000.0 if request.slo_ttft_ms is not None else None,
        )
        for admitter in self._admitters:
            if not admitter.admit(item, snapshot, candidates, now, self._draw.random(), 0.0):
                raise EppError(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"pool saturated: sheddable request refused by {admitter.name}",
                    wire.REJECTED_SATURATED,
                )

    def complete(self, decision: Decision) -> None:
        """The request ended (response done, stream closed or failed): release its in-flight booking."""
        if decision.site is not None:
            if self._federation is not None:
                self._federation.release(decision.site)
            return
        info = self._table.info(decision.slot)
        if info is not None and info.address == (decision.booked or decision.addresses[0]):
            self._table.release_pick(decision.slot, decision.tokens)
        for slot, address in decision.stages:
            info = self._table.info(slot)
            if info is not None and info.address == address:  # the slot was not reused for another endpoint
                self._table.release_pick(slot, decision.tokens)
        if self.flow is not None:
            self.flow.wake()  # room may have opened for a queued request
