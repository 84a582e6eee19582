"""Disaggregated serving: several profiles per request (upstream's `disagg-profile-handler`) and the deciders.

A request's decode endpoint is always chosen (the decode profile: the endpoint the gateway forwards to). The
prefill profile then runs only when the prefill decider approves, given the decode pick: the decode pod's routing
sidecar reads `x-prefiller-host-port` and runs the prompt there first (llm-d's P/D). The encode profile likewise
(E/P/D, `x-encoder-hosts-ports`). Each stage runs its own profile over the same candidates, so the gateway's subset
hint and the federation's residency narrowing (both applied before scheduling) bind every stage.

The deprecated handlers map as upstream: `pd-profile-handler` is the same handler with its older parameters
(`decodeProfile`, `prefillProfile`, `deciderPluginName` defaulting to `prefix-based-pd-decider`, `primaryPort`);
`data-parallel-profile-handler` runs the one profile, sends the request to the pod's `primaryPort` and names the
chosen rank's `ip:port` in `x-data-parallel-host-port`.

Pure: no clock, no I/O; `now` comes in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from epp.datastore import Snapshot, usable
from epp.datastore.table import IntArray
from epp.scheduling.filters import LabelFilter
from epp.scheduling.framework import CycleState, PrefixMatch, SchedulingRequest, produced
from epp.scheduling.pick_detail import EMPTY, PickDetail
from epp.scheduling.producers import tokenized
from epp.scheduling.profile import PluginWrapper, ProfileScheduler
from epp.scheduling.scheduler import Routing

PREFILLER_HEADER = "x-prefiller-host-port"
ENCODERS_HEADER = "x-encoder-hosts-ports"
DATA_PARALLEL_HEADER = "x-data-parallel-host-port"
DEFAULT_PREFIX_PRODUCER = "approx-prefix-cache-producer"


class Decider(Protocol):
    """Whether a stage runs for this request, given the decode run's state and its chosen endpoint."""

    name: str

    def disaggregate(self, state: CycleState, decode_slot: int) -> bool: ...


class AlwaysDisaggDecider:
    """`always-disagg-pd-decider`: every request runs the stage."""

    type_name = "always-disagg-pd-decider"

    def __init__(self, name: str = type_name) -> None:
        self.name = name

    def disaggregate(self, state: CycleState, decode_slot: int) -> bool:
        return True


class PrefixBasedDecider:
    """`prefix-based-pd-decider`: disaggregate when the prompt tokens the chosen decode endpoint does not hold are at
    least `non_cached_tokens` (0 turns the decider off: never), and the prompt has at least `prompt_tokens`.

    What the decode endpoint holds comes from the prefix producer's match for this request (upstream's
    PrefixCacheMatchInfo); without one, as upstream, the request is not disaggregated."""

    type_name = "prefix-based-pd-decider"

    def __init__(
        self,
        name: str = type_name,
        non_cached_tokens: int = 0,
        prompt_tokens: int = 0,
        prefix_producer: str = DEFAULT_PREFIX_PRODUCER,
    ) -> None:
        if non_cached_tokens < 0 or prompt_tokens < 0:
            raise ValueError("nonCachedTokens and promptTokens must be ≥ 0")
        self.name = name
        self.non_cached_tokens = non_cached_tokens
        self.prompt_tokens = prompt_tokens
        self.prefix_producer = prefix_producer

    def uncached(self, state: CycleState, decode_slot: int) -> int | None:
        """Prompt tokens the decode endpoint would have to compute itself; None when no prefix match was made."""
        match: PrefixMatch | None = produced(state, self.prefix_producer)
        if match is None:
            return None
        prompt = tokenized(state).n_tokens
        cached = 0
        if match.matched.size > decode_slot >= 0:
            cached = int(match.matched[decode_slot]) * match.block_tokens
        return max(0, prompt - cached)

    def disaggregate(self, state: CycleState, decode_slot: int) -> bool:
        if self.non_cached_tokens == 0:
            return False
        if self.prompt_tokens and tokenized(state).n_tokens < self.prompt_tokens:
            return False
        uncached = self.uncached(state, decode_slot)
        return uncached is not None and uncached >= self.non_cached_tokens


class StagedPick(tuple[int, ...]):
    """The decode result (slots best first, as a single profile's) and the stages that ran with it: the prefill
    slot (-1: none), the encode slots, and for data parallelism the port the gateway must send to instead."""

    prefill: int
    encode: tuple[int, ...]
    primary_port: int

    def __new__(
        cls, slots: Sequence[int], prefill: int = -1, encode: tuple[int, ...] = (), primary_port: int = 0
    ) -> StagedPick:
        self = super().__new__(cls, slots)
        self.prefill = prefill
        self.encode = encode
        self.primary_port = primary_port
        return self

    @property
    def booked(self) -> tuple[int, ...]:
        """Every endpoint this request occupies: decode first, then prefill and encode."""
        out = [int(self[0])] if self else []
        if self.prefill >= 0:
            out.append(self.prefill)
        out.extend(s for s in self.encode if s not in out)
        return tuple(out)


class _Detector(Protocol):
    def saturation(self, snapshot: Snapshot, candidates: IntArray, now: float) -> float: ...


class StagedSaturation:
    """The pool's saturation as a disaggregated request sees it: the detector over each stage's endpoints (those its
    profile's label filters keep: decode-capable, prefill-capable), the highest of them. As upstream's flow control
    ("effective" = max of the prefill and decode partitions), a request is let through only when every stage it may
    use has room, and a saturated prefill fleet holds requests back even while decode is idle. Other attributes
    (thresholds, freshness) are the wrapped detector's."""

    def __init__(self, detector: _Detector, partitions: Sequence[tuple[LabelFilter, ...]]) -> None:
        self.detector = detector
        self.partitions = tuple(p for p in partitions if p)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.detector, name)

    def stages(self, snapshot: Snapshot, candidates: IntArray) -> list[IntArray]:
        out = []
        for filters in self.partitions:
            kept = candidates
            for label_filter in filters:
                kept = label_filter.keep(snapshot, kept)
            if kept.size:
                out.append(kept)
        return out

    def saturation(self, snapshot: Snapshot, candidates: IntArray, now: float) -> float:
        whole = self.detector.saturation(snapshot, candidates, now)
        staged = [self.detector.saturation(snapshot, part, now) for part in self.stages(snapshot, candidates)]
        return max([whole, *staged]) if staged else whole

    def saturated(self, snapshot: Snapshot, candidates: IntArray, now: float) -> bool:
        return self.saturation(snapshot, candidates, now) >= 1.0


@dataclass(frozen=True, slots=True)
class Stage:
    profile: ProfileScheduler
    decider: Decider


class DisaggScheduler:
    """`disagg-profile-handler`: decode always, then encode and prefill where their deciders approve.

    A pick handler (`epp.scheduling.scheduler.PickHandler`) whose result is a `StagedPick`; `route` turns one into
    the decision's destination, stage bookings and sidecar headers. A stage whose profile finds no
    endpoint is skipped (the decode endpoint then does that work itself), never a failure of the request."""

    def __init__(
        self,
        decode: ProfileScheduler,
        prefill: Stage | None = None,
        encode: Stage | None = None,
        primary_port: int = 0,
        name: str = "disagg-profile-handler",
    ) -> None:
        self.name = name
        self.decode = decode
        self.prefill = prefill
        self.encode = encode
        self.primary_port = primary_port
        self.profile = decode.profile  # the decode profile: its producers are the config's
        self.freshness = decode.freshness
        partitions = [_label_filters(p) for p in self.profiles] if prefill or encode else []
        self.saturation = StagedSaturation(decode.saturation, partitions) if partitions else decode.saturation

    @property
    def profiles(self) -> tuple[ProfileScheduler, ...]:
        stages = (self.encode, self.prefill)
        return (self.decode, *(s.profile for s in stages if s is not None))

    @property
    def writes_response_headers(self) -> bool:
        return self.decode.writes_response_headers

    def response_headers(self, snapshot: Snapshot, slot: int) -> tuple[tuple[str, str], ...]:
        """The decode profile's (the client's session is bound to the endpoint it talks to)."""
        return self.decode.response_headers(snapshot, slot)

    def instrument(self, wrapper: PluginWrapper) -> None:
        for profile in self.profiles:
            profile.instrument(wrapper)

    def pick(self, snapshot: Snapshot, candidates: IntArray, request: SchedulingRequest, now: float) -> StagedPick:
        return self._staged(snapshot, candidates, request, now)[0]

    def pick_detailed(
        self, snapshot: Snapshot, candidates: IntArray, request: SchedulingRequest, now: float
    ) -> tuple[StagedPick, PickDetail]:
        """`pick`, with the decode (primary) profile's scores and its endpoint's cached prefix."""
        pick, state = self._staged(snapshot, candidates, request, now, detailed=True)
        return pick, (self.decode.detail(state, int(pick[0])) if pick else EMPTY)

    def _staged(
        self, snapshot: Snapshot, candidates: IntArray, request: SchedulingRequest, now: float, detailed: bool = False
    ) -> tuple[StagedPick, CycleState]:
        slots, state = self.decode.run(snapshot, candidates, request, now, detailed)
        if not slots:
            return StagedPick(()), state
        decode_slot = int(slots[0])
        encode: tuple[int, ...] = ()
        prefill = -1
        others = candidates
        if self.encode or self.prefill:
            # A stage goes only to endpoints whose data is usable: a prefill server that stopped answering its
            # scrapes is not named to the sidecar (the decode endpoint then prefills itself).
            others = candidates[candidates != decode_slot]
            others = others[usable(snapshot.scraped_at[others], snapshot.scrape_failures[others], now, self.freshness)]
        if self.encode is not None and state is not None and self.encode.decider.disaggregate(state, decode_slot):
            encode = tuple(int(s) for s in self.encode.profile.run(snapshot, others, request, now)[0])
        if self.prefill is not None and state is not None and self.prefill.decider.disaggregate(state, decode_slot):
            chosen = self.prefill.profile.run(snapshot, others, request, now)[0]
            prefill = int(chosen[0]) if chosen else -1
        return StagedPick(slots, prefill, encode, self.primary_port), state

    def route(self, pick: Sequence[int], addresses: Sequence[str]) -> Routing | None:
        """Where a pick of this handler goes: the decode endpoint (at the primary port, for data parallelism), the
        prefill and encode endpoints booked with it and named in the sidecar's headers. None for a pick that is not
        this handler's (the FailOpen fallback's): it goes where its slots are."""
        if not isinstance(pick, StagedPick) or not pick:
            return None
        destination = tuple(addresses[int(s)] for s in pick)
        booked = ""
        if pick.primary_port:
            booked = destination[0]
            destination = tuple(with_port(a, pick.primary_port) for a in destination)
        stages = tuple((slot, addresses[slot]) for slot in pick.booked[1:])
        return Routing(destination, stages, stage_headers(addresses, pick), booked)

    def describe(self) -> str:
        parts = [f"decode {self.decode.profile.describe()}"]
        if self.prefill is not None:
            parts.append(f"prefill when {self.prefill.decider.name}: {self.prefill.profile.profile.describe()}")
        if self.encode is not None:
            parts.append(f"encode when {self.encode.decider.name}: {self.encode.profile.profile.describe()}")
        return "; ".join(parts)


def _label_filters(profile: ProfileScheduler) -> tuple[LabelFilter, ...]:
    return tuple(f for f in profile.profile.filters if isinstance(f, LabelFilter))


def with_port(address: str, port: int) -> str:
    """`ip:port` with the port replaced (data parallelism: the pod's primary port)."""
    host = address.rsplit(":", 1)[0]
    return f"{host}:{port}"


def stage_headers(addresses: Sequence[str], pick: StagedPick) -> tuple[tuple[str, str], ...]:
    """The request headers the decode pod's sidecar reads, for the stages that ran."""
    out: list[tuple[str, str]] = []
    if pick.prefill >= 0:
        out.append((PREFILLER_HEADER, addresses[pick.prefill]))
    if pick.encode:
        out.append((ENCODERS_HEADER, ",".join(addresses[s] for s in pick.encode)))
    if pick.primary_port and pick:
        out.append((DATA_PARALLEL_HEADER, addresses[int(pick[0])]))
    return tuple(out)
