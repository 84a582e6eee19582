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
from typing import Protocol, cast

import numpy as np

from epp import wire
from epp.datastore import EndpointTable, Snapshot, usable
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.observations import Observation, PickFeatures
from epp.datastore.pool import FailureMode
from epp.datastore.pools import PoolSlots
from epp.datastore.table import IntArray
from epp.director.decision import Decision, Timing
from epp.director.flow import FlowHold
from epp.director.pipeline import DecisionPipeline
from epp.director.rewrite import ModelRewriter
from epp.director.tokens import RenderTokenizer
from epp.errors import EppError, ErrorCode
from epp.federation.policy import Route
from epp.flowcontrol import QueuedRequest
from epp.flowcontrol.admission import Admitter
from epp.requests import InferenceRequest
from epp.scheduling import conformance_selection
from epp.scheduling.degradation import DegradationWatch, Transition
from epp.scheduling.framework import CycleState
from epp.scheduling.pick_detail import BUFFERS, PickDetail
from epp.scheduling.producers import estimate_tokens
from epp.scheduling.receipt import Receipt, ReceiptReader, scored_pairs
from epp.scheduling.scheduler import Routing, Scheduler

log = logging.getLogger(__name__)
_NO_ENDPOINTS = wire.REJECTED_NO_ENDPOINTS  # upstream's reason when no candidate endpoint exists at all
_PREFER = wire.PREFER_HEADER
_NAN = float("nan")  # a target the observation does not carry (not known yet, or already observed)


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


class ReceiptSink(Protocol):
    """Where route receipts and the degradation watch's transitions go (epp.observability.receipts): aggregated
    metrics, the sampled log line, the alarm's log lines."""

    def receipt(self, receipt: Receipt, logged: bool) -> None: ...

    def transition(self, transition: Transition) -> None: ...


# One pick in this many is shown to the degradation watch, receipts emitted or not; when they are not, it is also
# the only pick read for its receipt (the aggregated receipt metrics' sample). A read and watched receipt costs
# ~65k instructions with the default profile, ~45k with a random pick (a detailed run, its reading, the watch, the
# sink: stream_path at 1,000 requests, the sample on minus off, × 32; two runs: 57k and 74k, 54k and 39k, the
# count's ±0.5k a request of allocation-layout noise × 32; benchmarks/RESULTS.md): one in 32 is ~1.5-2k a pick
# averaged, under 1 % of the path; with the watch's window of 6 observations a verdict spans 192 picks, an alarm
# is up within ~400 of its cause.
WATCH_EVERY = 32


def _scores(addresses: Sequence[str], detail: PickDetail) -> tuple[tuple[str, float], ...]:
    """(address, weighted score) of every endpoint the primary profile scored (from the arrays' memoryviews where
    the runner keeps them: `pick_detail.BUFFERS`)."""
    state = detail.state
    buffers = state.scratch.get(BUFFERS) if state is not None else None
    if buffers is not None:
        return scored_pairs(addresses, buffers[0], buffers[1])
    return scored_pairs(addresses, detail.scored, detail.scores)


def _no_account(*_: object) -> None:
    """Where the reader has no compiled account (never called: the plan is None)."""


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
        flow: FlowHold | None = None,
        emit_scores: bool = False,
        pool: str | None = None,
        emit_receipts: bool = False,
        receipt_log_every: int = 0,
        receipts: ReceiptSink | None = None,
        watch_every: int = WATCH_EVERY,
    ) -> None:
        """`objectives` gives priorities and model rewrites (none: every request priority 0, no rewrite);
        `saturation` decides shedding (none: the scheduler's own `.saturation`);
        `seed` makes weighted rewrite choices reproducible; `honour_subset` False ignores the gateway's subset hint
        (upstream's --disable-endpoint-subset-filter); `test_selection` honours conformance's
        `test-epp-endpoint-selection` header (--enable-test-endpoint-selection; tests only); `flow` is flow
        control (the `flowControl` gate): requests wait in its queues before they get here, and the legacy shedding
        step is off; `emit_scores` puts the primary profile's per-endpoint scores on the decision
        (--emit-endpoint-scores); `pool` (a pool key, `namespace/name`) narrows the candidates to that pool's
        endpoints when the table holds several pools (epp.datastore.pools); None: every endpoint of the table;
        `emit_receipts` puts a route receipt on the decision too, for every pick (--emit-route-receipts);
        `receipts` gets every receipt read (every pick with `emit_receipts`, else one in `watch_every`, 0: none),
        with one in `receipt_log_every` marked for the log (0: none); the degradation watch (its `pool`'s) sees
        one pick in `watch_every` either way."""
        self._table = table
        self._scheduler = scheduler.handler
        self._clock = clock
        self._failure_mode = failure_mode
        self._observer = observer or _NullObserver()
        self._objectives = objectives
        self._saturation = saturation if saturation is not None else scheduler.saturation
        self._rewriter = ModelRewriter(objectives, seed)
        self._federation = federation  # None: no federation, every candidate is local
        self._honour_subset = honour_subset
        self._test_selection = test_selection
        self.flow = flow
        self._admitters: tuple[Admitter, ...] = scheduler.admitters
        self._draw = random.Random(seed)
        # Asked per request only when a plugin writes a response header (session affinity); most profiles have none.
        self._response_headers = scheduler.response_headers
        self._routing = scheduler.routing  # None: every pick goes to its slots' addresses (one profile)
        self._pool = PoolSlots(pool) if pool is not None else None
        self._emit_scores = emit_scores or emit_receipts  # a receipt is a superset of the scores
        self._emit_receipts = emit_receipts
        profiles = scheduler.profiles
        self._reader = profiles[0].receipts if profiles and scheduler.detailed is not None else None
        self._profile_names = tuple(p.profile.name for p in profiles)
        self.watch = (
            DegradationWatch(profiles[0].receipts.watched(), pool=pool or "") if self._reader is not None else None
        )
        self._sink = receipts
        self._watch_every = watch_every if self._reader is not None and watch_every > 0 else 0
        self._log_every = receipt_log_every
        self._picks = 0  # since the last pick shown to the watch
        self._receipts = 0  # receipts read, for the log's sample
        # A receipt read, its JSON and pairs, and handed to the sink in one compiled call where the reader has one
        # (`ReceiptReader.compiled_account`): the sink's `held` list, appended to there short of its `fold_every`.
        compiled = (
            self._reader.compiled_account(
                emit_receipts,
                self._emit_scores,
                getattr(receipts, "held", None),
                getattr(receipts, "fold_every", 0),
                receipts is not None,
                (wire.DESTINATION_SCORES_KEY, wire.ROUTE_RECEIPT_KEY),  # emitted: the answer's entries as bytes
            )
            if self._reader is not None
            else None
        )
        self._account_pick: Callable[..., object] = _no_account
        self._plan: list[object] | None = None  # None: no compiled call, `_account` reads each receipt
        if compiled is not None:
            self._account_pick, self._plan = compiled
        # The handler's pick with its PickDetail (scores, the picked endpoint's cached prefix), asked for only when
        # scores are emitted or a request says `Prefer: if-available`; a handler without it has no detail.
        self._detailed = scheduler.detailed
        render = scheduler.tokenizer  # the vllm token-producer's render endpoint: the engine's token ids
        tokenizer = (
            RenderTokenizer(render.url, render.model_name, render.timeout_s, render.chat_timeout_s, render.cache_size)
            if render is not None
            else None
        )
        self._freshness = scheduler.freshness  # what FailOpen's fallback counts as a usable candidate
        self._learners = scheduler.learners  # the observation feed's sinks; none: no pick features are built
        self._uncached = scheduler.uncached
        # The stages before `decide` (the render call, flow control's hold) and after `complete`, which the
        # ext_proc adapter runs for every stream (epp.director.pipeline).
        # ids of the decisions whose first byte came (each until its `complete`) → whether their TTFT was fed then
        self._first_bytes: dict[int, bool] = {}
        self.pipeline = DecisionPipeline(self.decide, self.complete, clock, tokenizer, flow, first_byte=self.first_byte)

    @property
    def table(self) -> EndpointTable:
        return self._table

    def candidates(self, snapshot: Snapshot, subset: Sequence[str] | None) -> IntArray:
        """Slots that may serve: present endpoints, narrowed to the gateway's subset hint (ip:port) if given."""
        slots = snapshot.slots if self._pool is None else self._pool.of(snapshot)
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
        if subset is None:
            candidates = snapshot.slots if self._pool is None else self._pool.of(snapshot)
        else:
            candidates = self.candidates(snapshot, subset)
        if self._test_selection:
            named = request.headers.get(conformance_selection.HEADER, "").strip()
            if named:
                candidates = conformance_selection.selected(snapshot, candidates, named)
                if candidates.size == 0:
                    raise EppError(
                        ErrorCode.SERVICE_UNAVAILABLE,
                        f"{conformance_selection.HEADER} names no pool endpoint",
                        _NO_ENDPOINTS,
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
        headers = request.headers
        conditional = _PREFER in headers and wire.prefers_if_available(headers)
        detail: PickDetail | None = None
        account = self._emit_receipts
        watched = False
        if self._watch_every:
            self._picks += 1
            if self._picks >= self._watch_every:
                self._picks = 0
                account = watched = True
        try:
            if (conditional or self._emit_scores or account) and self._detailed is not None:
                slots, detail = self._detailed(snapshot, candidates, request, now)
            else:
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
        if conditional and (detail is None or detail.cached_blocks <= 0):
            # Upstream's conditional-decode gate: after the pick, before anything is booked; no reason header.
            raise EppError(ErrorCode.PRECONDITION_FAILED, "no decode worker has the requested KV cache")
        primary = int(slots[0])
        tokens = len(request.token_ids) if request.token_ids else estimate_tokens(request.prompt)
        prefill = self._uncached(primary, tokens) if self._uncached is not None else tokens
        pick = self._features(snapshot, primary, tokens, prefill, now) if self._learners else None
        self._table.book_pick(primary, tokens, prefill)  # the prefill booked with it, in the same call
        addresses = snapshot.addresses
        routing = self._routing(slots, addresses) if self._routing is not None else None
        receipt = None
        metadata = b""
        if account and detail is not None and detail.state is not None and self._reader is not None:
            logged = False
            if self._log_every and self._sink is not None:
                self._receipts += 1
                if self._receipts >= self._log_every:
                    self._receipts = 0
                    logged = True
            names = self._profile_names  # P/D: the decode profile judged, the others booked too
            profiles = (
                names[: 1 + len(routing.stages)] if routing is not None and routing.stages and len(names) > 1 else None
            )
            # the receipt, its JSON and the scores' pairs in one compiled call, handed to the sink there too
            plan = self._plan
            got = (
                self._account_pick(plan, detail.state, primary, request.queued_s, profiles, watched or logged)
                if plan is not None
                else None
            )
            if got.__class__ is tuple and len(got) == 2:
                receipt, scores = got
            else:
                receipt, scores = self._account(
                    got, self._reader, detail.state, primary, profiles, request.queued_s, now, watched, logged
                )
            if scores.__class__ is bytes:  # the scores' and the receipt's `envoy.lb` entries, written by that call
                metadata, scores = scores, ()
        else:
            scores = _scores(addresses, detail) if self._emit_scores and detail is not None else ()
        if routing is not None:
            decision = self._routed(routing, primary, degraded, body, original_model, request.model, tokens)
            decision = decision._replace(prefill=prefill)
            if pick is not None:
                decision = decision._replace(pick=pick)
            if self._response_headers:
                decision = decision._replace(response_headers=self._response_headers(snapshot, primary))
            if receipt is not None:
                decision = decision._replace(receipt=receipt, metadata=metadata)
            return decision._replace(scores=scores) if scores else decision
        decision = Decision(
            addresses=(addresses[primary],) if len(slots) == 1 else tuple(addresses[s] for s in slots),
            slot=primary,
            degraded=degraded,
            body=body,
            original_model=original_model,
            target_model=request.model,
            tokens=tokens,
            prefill=prefill,
            response_headers=self._response_headers(snapshot, primary) if self._response_headers else (),
            scores=scores,
            pick=pick,
            receipt=receipt,
            metadata=metadata,
        )
        return decision

    def _account(
        self,
        got: object,
        reader: ReceiptReader,
        state: CycleState,
        primary: int,
        profiles: tuple[str, ...] | None,
        flow_wait_s: float,
        now: float,
        watched: bool,
        logged: bool,
    ) -> tuple[str | None, tuple[tuple[str, float], ...] | bytes]:
        """The pick's receipt (`got`: the compiled call's (receipt, JSON, pairs or the `envoy.lb` entries' bytes) to
        hand on, else read here) shown to the degradation watch (`watched`: its sample) and the sink (`logged`: the
        log's sample); its JSON when it is emitted, and the scores' pairs (or those bytes) when they are."""
        if got.__class__ is tuple:
            receipt, text, scores = cast(tuple[Receipt, str | None, tuple[tuple[str, float], ...] | bytes], got)
        else:
            receipt, text, scores = reader.account(
                state, primary, flow_wait_s, profiles, self._emit_receipts, self._emit_scores
            )
        watch = self.watch  # built with the reader
        transitions = watch.observe(receipt, now) if watched and watch is not None else ()
        sink = self._sink
        if sink is not None:
            sink.receipt(receipt, logged)
            for transition in transitions:
                sink.transition(transition)
        return text, scores

    def _features(self, snapshot: Snapshot, slot: int, tokens: int, uncached: int, now: float) -> PickFeatures:
        """The picked endpoint as this pick saw it, before its booking: the observation feed's features."""
        scraped = snapshot.scraped_at.item(slot)
        return PickFeatures(
            tokens,
            uncached,
            snapshot.waiting.item(slot) + snapshot.picks_since_scrape.item(slot),
            snapshot.running.item(slot),
            snapshot.kv_usage.item(slot),
            snapshot.inflight.item(slot),
            now,
            now - scraped if scraped == scraped else float("inf"),
            snapshot.inflight_tokens.item(slot),
            snapshot.num_blocks.item(slot) * snapshot.block_size.item(slot),
        )

    def _fallback(self, snapshot: Snapshot, candidates: IntArray, now: float) -> int:
        """FailOpen's pick when the scheduler broke: a random candidate among those with fresh metrics (the
        usable ones), or among all of them when none is usable (never scraped yet: the pool still serves)."""
        fresh = candidates[
            usable(snapshot.scraped_at[candidates], snapshot.scrape_failures[candidates], now, self._freshness)
        ]
        chosen = fresh if fresh.size else candidates
        return int(chosen[self._draw.randrange(chosen.size)])

    def _routed(
        self,
        routing: Routing,
        primary: int,
        degraded: bool,
        body: bytes | None,
        original_model: str,
        target_model: str,
        tokens: int,
    ) -> Decision:
        """A decision the handler routes (prefill/decode, data parallelism): the gateway forwards to its destination;
        the other endpoints travel in the headers the decode pod's sidecar reads, and are booked in flight with it,
        released together."""
        for slot, _ in routing.stages:
            self._table.book_pick(slot, tokens)
        return Decision(
            addresses=routing.destination,
            slot=primary,
            degraded=degraded,
            body=body,
            original_model=original_model,
            target_model=target_model,
            headers=routing.headers,
            tokens=tokens,
            stages=routing.stages,
            booked=routing.booked,
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

    def first_byte(self, decision: Decision, timing: Timing | None = None) -> None:
        """The response's first byte came: the request's prefill is done, so its prefill booking is released now
        rather than at its end (`complete` then releases the rest), and, with the stream's `timing` of it (its TTFT;
        TPOT and usage are not known yet), every learner of the feed observes the request's TTFT now rather than at
        its end (a batch request on a slow endpoint completes tens of seconds after its first byte: the latency
        model and the knee would learn nothing from it meanwhile). `complete` then observes only what the end adds
        (TPOT), so no TTFT is counted twice. Once per decision; later calls do nothing."""
        if decision.site is not None:
            return
        feed = timing is not None and decision.pick is not None and timing.ttft_s == timing.ttft_s
        if not decision.prefill and not feed:
            return
        key = id(decision)  # the stream holds `decision` until `complete`: its id is not reused meanwhile
        done = self._first_bytes
        if key in done:
            return
        done[key] = feed
        info = self._table.info(decision.slot)
        ours = info is not None and info.address == (decision.booked or decision.addresses[0])
        if decision.prefill and ours:
            self._table.release_prefill(decision.slot, decision.prefill)
        if feed:
            assert timing is not None
            self._observe(decision, timing.ttft_s, _NAN, -1, timing)

    def complete(self, decision: Decision, timing: Timing | None = None) -> None:
        """The request ended (response done, stream closed or failed): release its in-flight booking; with the
        response's `timing` (it ended normally), every learner of the feed observes what it cost (its TTFT only if
        `first_byte` did not already feed it)."""
        if decision.site is not None:
            if self._federation is not None:
                self._federation.release(decision.site)
            return
        info = self._table.info(decision.slot)
        ours = info is not None and info.address == (decision.booked or decision.addresses[0])
        done = self._first_bytes
        fed = done.pop(id(decision), None) if done else None
        if ours:  # the prefill with it unless released at its first byte
            self._table.release_pick(decision.slot, decision.tokens, decision.prefill if fed is None else 0)
        for slot, address in decision.stages:
            info = self._table.info(slot)
            if info is not None and info.address == address:  # the slot was not reused for another endpoint
                self._table.release_pick(slot, decision.tokens)
        if self.flow is not None:
            self.flow.wake()  # room may have opened for a queued request
        if timing is not None and decision.pick is not None:
            self._observe(decision, _NAN if fed else timing.ttft_s, timing.tpot_s, timing.output_tokens, timing)

    def _observe(self, decision: Decision, ttft_s: float, tpot_s: float, output_tokens: int, timing: Timing) -> None:
        """Every learner of the feed observes what `decision`'s request cost (NaN: not known, or already fed)."""
        pick = decision.pick
        assert pick is not None
        observation = Observation(
            decision.slot,
            decision.booked or decision.addresses[0],
            pick,
            ttft_s,
            tpot_s,
            output_tokens,
            timing.streaming,
            timing.waited_s,
            self._clock(),
        )
        for learner in self._learners:
            learner.observe(observation)
