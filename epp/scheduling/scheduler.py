"""What `build_scheduler` returns: one frozen description of how the pool decides, the same for every caller.

`epp serve`, its workers, `epp check-config` and the benchmarks read these fields whatever profile handler the
config chose (one profile, data parallelism, prefill/decode): none of them asks which handler it is. What differs
between handlers stays behind two seams: `handler.pick` (the slots, best first) and `routing` (for a handler whose
pick books more endpoints than the first or sends the request elsewhere than its address).

Everything a caller used to read off the handler, or set on it after construction (flow control, admitters), is
decided by the builder once and carried here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from epp.datastore import Freshness, Snapshot
from epp.datastore.observations import ObservationSink
from epp.datastore.table import IntArray
from epp.flowcontrol import FlowSettings
from epp.flowcontrol.admission import Admitter
from epp.scheduling.framework import SchedulingRequest
from epp.scheduling.pick_detail import PickDetail
from epp.scheduling.precise import PrecisePrefixCacheProducer
from epp.scheduling.prefix import PrefixCacheScorer
from epp.scheduling.producers import ApproxPrefixCacheProducer
from epp.scheduling.profile import PluginWrapper, ProfileScheduler


class PickHandler(Protocol):
    """The decision seam: pure, given a snapshot, candidate slots (distinct, ascending), the request and `now`;
    returns slots to try, best first (the rest are fallbacks). An empty result means no candidate fits."""

    def pick(
        self, snapshot: Snapshot, candidates: IntArray, request: SchedulingRequest, now: float
    ) -> Sequence[int]: ...


class PoolSaturation(Protocol):
    """The pool's saturation (>= 1.0: saturated) over some candidates: what shedding, flow control's dispatch and
    the federation's overflow read."""

    def saturation(self, snapshot: Snapshot, candidates: IntArray, now: float) -> float: ...

    def saturated(self, snapshot: Snapshot, candidates: IntArray, now: float) -> bool: ...


class NeverSaturated:
    """The saturation of a scheduler assembled by hand (a test's, a benchmark's fixed pick): nothing is shed."""

    def saturation(self, snapshot: Snapshot, candidates: IntArray, now: float) -> float:
        return 0.0

    def saturated(self, snapshot: Snapshot, candidates: IntArray, now: float) -> bool:
        return False


class Routing(NamedTuple):
    """Where a pick sends the request when that is more than its slots' addresses (prefill/decode stages, data
    parallelism's port): the addresses the gateway forwards to, the other endpoints booked in flight with the
    first, the request headers the gateway adds, and the address booked on the first slot when the destination
    differs from it ("" when it does not)."""

    destination: tuple[str, ...]
    stages: tuple[tuple[int, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    booked: str = ""


# The handler's own pick and the snapshot's addresses → its routing; None: the slots' addresses, nothing more.
Router = Callable[[Sequence[int], Sequence[str]], Routing | None]
# The handler's pick with what it knew beyond its slots (scores, the picked endpoint's cached prefix).
DetailedPick = Callable[[Snapshot, IntArray, SchedulingRequest, float], tuple[Sequence[int], PickDetail]]
# (picked slot, prompt tokens) → the prompt tokens that endpoint does not hold, as the pick just reckoned them.
UncachedTokens = Callable[[int, int], int]
# A pick's first slot → the headers the response carries back to the client (session tokens).
ResponseHeaders = Callable[[Snapshot, int], tuple[tuple[str, str], ...]]


@dataclass(frozen=True, slots=True)
class RenderSettings:
    """The vllm token-producer's render endpoint: the settings `epp.director.tokens.RenderTokenizer` is built from
    (the I/O client lives outside decision code)."""

    url: str
    model_name: str
    timeout_s: float
    chat_timeout_s: float
    cache_size: int


@dataclass(frozen=True, slots=True)
class Scheduler:
    """How the pool decides, as the config says: built by `build_scheduler`, read by every caller.

    `profiles` are the profile runners the handler uses (decode first), for instrumentation and tracing;
    `prefix_scorers` every profile's self-contained prefix-cache scorers and approximate prefix producers (those that
    learn from picks), each once, in configuration order (the workers' pick
    log names a scorer by its position; the prefix metrics read their indexes); `kv_events` the precise producer
    whose KV-events feeder the composition root starts."""

    handler: PickHandler
    saturation: PoolSaturation = field(default_factory=NeverSaturated)
    freshness: Freshness = field(default_factory=Freshness)
    # The saturation counts our own requests in flight (concurrency-detector): it leads the scrape instead of
    # lagging it, which is how long in-flight eviction waits for a reclaim to show.
    saturation_leads: bool = False
    admitters: tuple[Admitter, ...] = ()
    flow: FlowSettings | None = None  # the flowControl feature gate on: the queues' settings
    tokenizer: RenderSettings | None = None
    prefix_scorers: tuple[PrefixCacheScorer | ApproxPrefixCacheProducer, ...] = ()
    response_headers: ResponseHeaders | None = None  # None: no plugin writes a response header
    routing: Router | None = None  # None: a pick goes to its slots' addresses
    detailed: DetailedPick | None = None  # `handler.pick` with its PickDetail; None: a handler without one
    description: str = ""
    profiles: tuple[ProfileScheduler, ...] = ()
    kv_events: PrecisePrefixCacheProducer | None = None
    # The observation feed's learners (epp.datastore.observations): each request's Observations (its first byte,
    # its end) go to every one; empty: the director builds no pick features at all.
    learners: tuple[ObservationSink, ...] = ()
    uncached: UncachedTokens | None = None  # None: every prompt token counts as uncached

    def instrument(self, wrapper: PluginWrapper) -> None:
        """Time every profile's plugins in one pick of `wrapper.every` (`ProfileScheduler.instrument`)."""
        for profile in self.profiles:
            profile.instrument(wrapper)
