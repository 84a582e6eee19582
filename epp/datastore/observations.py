"""The picker's own observations of routed requests: what an endpoint looked like when a request was picked onto
it, and what the request then cost there (TTFT, TPOT). The learners (the online latency model, saturation that
calibrates itself) read nothing else, so they need no sidecar and no training job: every routed request is a
sample, taken in the process that decides.

Values only. The director makes one `PickFeatures` per pick (`Decision.pick`) and hands `Observation`s to every
`ObservationSink` of the scheduler: one at the response's first byte with its TTFT alone (`Director.first_byte`:
learned when it happens, not when a long response ends) and one when the request ends normally with what the end
adds (`Director.complete`: TPOT, output tokens; its TTFT NaN when the first byte gave it). A target an observation
does not carry is NaN. Times are the director's clock (virtual time in the benchmarks), durations the stream's,
so no learner reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol


class PickFeatures(NamedTuple):
    """The picked endpoint as the pick saw it (a NamedTuple: one is built per request)."""

    prompt_tokens: int  # the request's prompt tokens (engine ids when rendered, else the estimate)
    uncached_tokens: int  # prompt tokens the endpoint does not hold by the prefix producers' reckoning
    queue: float  # effective queue: scraped waiting + our picks since that scrape (NaN: no usable scrape)
    running: float  # scraped running requests (NaN: none)
    kv_usage: float  # scraped KV-cache use, 0..1 (NaN: none)
    inflight: int  # our own requests in flight there before this one was booked
    picked_at: float  # the director's clock
    scrape_age_s: float  # picked_at − the endpoint's last scrape (inf: never scraped)
    inflight_tokens: int = 0  # prompt tokens of our requests in flight there before this one was booked
    capacity_tokens: float = math.nan  # its KV capacity (scraped blocks × block size): its hardware class; NaN unknown


@dataclass(frozen=True, slots=True)
class Observation:
    """One routed request on one endpoint: at its first byte (TTFT only) or at its end (the rest)."""

    slot: int
    address: str  # the slot's address at pick: a slot reused for another endpoint changes it
    pick: PickFeatures
    ttft_s: float  # first response byte − the decision (a non-streaming response: its whole time); NaN: no byte
    tpot_s: float  # (last chunk − first chunk) / (output tokens − 1); NaN unless streaming with > 1 token
    output_tokens: int  # from the response's usage; -1: not reported (or not yet: the first byte's)
    streaming: bool
    waited_s: float  # received → decided (flow-control queue, render call)
    finished_at: float  # the director's clock when this was observed (the first byte, or the request's end)


class ObservationSink(Protocol):
    """A learner of the feed: pure, bounded state; `obs.finished_at` is its only notion of time."""

    def observe(self, obs: Observation) -> None: ...
