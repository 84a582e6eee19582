"""`self-calibrating-detector`: saturation from each endpoint's own knee, learned from the picker's observations.

Upstream's detectors need a number per deployment: `utilization-detector`'s queue depth and KV thresholds,
`concurrency-detector`'s maxConcurrency. The right number depends on the engine (max-num-seqs 32 or 600, an H100
or an L4, the prompts it gets), so a mixed pool has no right number at all. This detector needs none: it learns,
per endpoint, the *knee* — how many requests the engine can hold (running + waiting, ours and anyone's) before
queueing delay starts to grow — from every request's TTFT (`observe`, the observation feed of
`epp.datastore.observations`, at the response's first byte), and reads saturation as each endpoint's load over
its knee, averaged over the pool (each endpoint at most full while any has room).

The knee, per observation (load `L` = running + effective queue at pick, this request the `L + 1`-th):
- *delayed* means the request's TTFT per token (uncached prompt tokens + `TOKEN_OFFSET`, so a cached prompt's
  one step counts) was more than `DELAY_FACTOR` × the endpoint's floor: its queueing delay at least matched the
  work itself, the classic knee (an M/M/1 queue at half load waits one service time);
- not delayed: the endpoint held `L + 1` without queueing. Until the first delay the knee is twice the largest
  such load (a slow start: an endpoint never seen full has room we have not seen); after it, the knee × 1.01 per
  undelayed observation near the knee (a probe), so a gate at the knee still discovers more room, the step doubling
  every `CLIMB_DOUBLING` such observations in a row (never past twice the load held): a slow start ended early by a
  burst's delay (knees of 15-30 on 256-sequence H100s) climbs back in seconds, not the ~40 s ×1.01 took; a delay
  near the knee starts the step again;
- delayed at a load below the knee: the knee moves halfway down to that load.
Observations come only at first bytes, so a knee below the load an endpoint already holds (a burst's delay ended
its slow start low) would learn nothing until requests finished; with fresh data, nothing waiting inside and no
prefill of ours pending there (`Snapshot.prefill_tokens`: this process's picks), the knee reads one above the load:
one request at a time tests it, as TCP's ACKs clock its window. With the pool's mean counting no endpoint past full
while another has room, benchmarks.flow_control's noisy neighbour served 54.4 req/s, now 55.5 (seeds 0-9), as the
threshold configuration.
The slow start also reads the scrapes: twice the most requests the engine was seen running (held without a queue),
so a pool whose data goes stale before any request has finished still serves by its own bookings; and it holds
between scrapes: with fresh data a probing endpoint counts full once its load has grown `PACE` × (1.25) from what
its last scrape showed it holding (as TCP's slow start grows once per round trip), so a burst within one scrape
interval does not jump to a knee learned from one good moment long before (a 32-sequence engine's slow-start knee
of 52; doubling per scrape let 49 requests wait inside the engines in benchmarks.flow_control's overshoot); until
its next scrape is overdue (a round trip that does not come: a scrape outage held a 16-endpoint pool at 1.25× its
last scrape for the 2 s until its data counted stale).
The floor follows the fast requests at once and drifts up slowly (low load only): a slower model server is
relearned, and a slot whose address changed starts again.

Stale data lowers confidence instead of counting as full or empty (upstream counts it full, and a small pool
freezes, llm-d-router #2408). Our own requests in flight to an endpoint are known without any scrape, so an
endpoint's load is `c × max(scraped load, ours) + (1 − c) × ours`, the scraped load being the scrape's running +
waiting + our picks since, but no more than the others' part of it (less our requests in flight when it was taken) +
ours now: our requests that finished since the scrape are gone, however old it is; with confidence `c` = 1 while its
data is usable, then `staleness / age` (0 once it fails `max_failures` scrapes in a row or was never scraped); an
observation taken on stale features moves the knee by `c` of a full step. A stale endpoint keeps taking requests up
to its knee, counted by our own bookings; a wholly stale pool too (no freeze). KV-cache use is the one physical
limit read as is (1.0 = full); a request the scrape showed waiting counts while those there with it may still be
(the others' then and ours then still in flight), not after they have all finished. An endpoint not yet learned
borrows the pool's median knee; with no knee learned anywhere (a cold pool), one request waiting inside it counts
full, as `queueDepthThreshold: 1`; and so does a settled endpoint whose data is fresh, whatever room its knee
leaves, until its next scrape is overdue (twice the last interval between its scrapes: then the knee and our
bookings alone). The knee bounds the load where the engine's queue does not show it (a batch with room whose TTFT
grows); the queue paces dispatch to the scrapes, so requests are not sent in bursts that share the engine's
steps, which read as delays at any load and pulled the knee far below what the engine holds (the noisy neighbour of
`benchmarks.flow_control`: 25.9 req/s served of 55).

Pure: `now` and the observations' `finished_at` are its only time; bounded per-slot state (a few floats), written
by the observations and by the first read of each scrape (reading a snapshot again changes nothing).
"""

from __future__ import annotations

import math

import numpy as np

from epp.datastore import Freshness, Snapshot
from epp.datastore.observations import Observation
from epp.datastore.table import BoolArray, FloatArray, IntArray
from epp.scheduling.framework import CycleState

SELF_CALIBRATING_TYPE = "self-calibrating-detector"
DELAY_FACTOR = 3.0  # delayed: TTFT per token above this × the floor (queueing delay ≥ twice the work)
TOKEN_OFFSET = 256.0  # tokens added to the uncached ones: one engine step's fixed cost, in prefill tokens
FLOOR_DRIFT = 0.02  # how far toward a slower request the floor moves per low-load observation
SLOW_START = 2.0  # until the first delay, the knee is this × the largest load held without delay
NEAR_KNEE = 0.9  # an undelayed observation at or above this × the knee probes further
NEAR_KNEE_ABOVE = 1.1  # a delayed observation up to this × the knee pulls it down
STEP_UP = 0.01  # the probe: the knee × (1 + this) per undelayed observation near it
CLIMB_DOUBLING = 2.0  # the probe's step doubles every this many undelayed observations near the knee in a row
PACE = 1.25  # between scrapes a probing endpoint with fresh data holds at most this × its last scrape's load
STEP_DOWN = 0.04  # the knee × (1 − this) per delayed observation below it: it settles where a fifth of the
#                   requests near it are delayed (0.01 / (0.01 + 0.04)), a few unlucky ones do not pull it down


class KneeDetector:
    """Per-endpoint knees learned online; the pool's saturation = mean over candidates of load / knee."""

    type_name = SELF_CALIBRATING_TYPE
    weighs_staleness = True  # stale data lowers its confidence: flow control's all-stale fallback is not needed

    def __init__(self, name: str = SELF_CALIBRATING_TYPE, freshness: Freshness | None = None) -> None:
        self.name = name
        self.freshness = freshness or Freshness()
        self._knee = np.full(0, np.nan)  # requests the endpoint holds before queueing delay grows; NaN: unknown
        self._floor = np.full(0, np.nan)  # its undelayed TTFT per token
        self._probing = np.zeros(0, dtype=bool)  # slow start: no delay seen yet
        self._run = np.zeros(0)  # undelayed observations near the knee since the last delayed one there
        self._top = np.full(0, np.nan)  # the most requests it was seen running (fresh scrapes)
        self._seen_at = np.full(0, np.nan)  # the last scrape read (its scraped_at)
        self._ours_at_scrape = np.full(0, np.nan)  # our requests in flight when it was taken
        self._interval = np.full(0, np.nan)  # the time between its last two scrapes read
        self._address: list[str] = []
        self.observations = 0

    # -- learning ------------------------------------------------------------------------------------------------

    def _slot(self, slot: int, address: str) -> None:
        if slot >= self._knee.size:
            grow = max(slot + 1, 2 * self._knee.size) - self._knee.size
            self._knee = np.concatenate([self._knee, np.full(grow, np.nan)])
            self._floor = np.concatenate([self._floor, np.full(grow, np.nan)])
            self._probing = np.concatenate([self._probing, np.ones(grow, dtype=bool)])
            self._run = np.concatenate([self._run, np.zeros(grow)])
            self._top = np.concatenate([self._top, np.full(grow, np.nan)])
            self._seen_at = np.concatenate([self._seen_at, np.full(grow, np.nan)])
            self._ours_at_scrape = np.concatenate([self._ours_at_scrape, np.full(grow, np.nan)])
            self._interval = np.concatenate([self._interval, np.full(grow, np.nan)])
            self._address += [""] * grow
        if self._address[slot] != address:  # a new endpoint in a reused slot: what we knew was another's
            known = self._address[slot] != ""  # else only its scrapes were read (what they said is its own)
            self._address[slot] = address
            self._knee[slot] = math.nan
            self._floor[slot] = math.nan
            self._probing[slot] = True
            self._run[slot] = 0.0
            if known:
                self._top[slot] = math.nan
                self._seen_at[slot] = math.nan
                self._interval[slot] = math.nan

    def observe(self, obs: Observation) -> None:
        """One request's TTFT (its first byte): its load at pick and its TTFT move the endpoint's floor and knee."""
        if not obs.ttft_s >= 0:  # NaN (no first byte) or a clock that went back
            return
        self._slot(obs.slot, obs.address)
        f = obs.pick
        c = _confidence(f.scrape_age_s, self.freshness.staleness_s)
        scraped = f.running + f.queue
        ours = float(f.inflight)
        load = ours if math.isnan(scraped) else c * max(scraped, ours) + (1.0 - c) * ours
        held = load + 1.0  # this request made it load + 1
        per_token = obs.ttft_s / (max(f.uncached_tokens, 0) + TOKEN_OFFSET)
        s = obs.slot
        knee, floor = float(self._knee[s]), float(self._floor[s])
        if math.isnan(floor) or per_token < floor:
            floor = per_token if math.isnan(floor) else 0.5 * (floor + per_token)
        elif math.isnan(knee) or held <= 0.5 * knee:
            floor += FLOOR_DRIFT * c * (per_token - floor)
        delayed = per_token > DELAY_FACTOR * floor
        if math.isnan(knee):
            knee = SLOW_START * held
        if self._probing[s]:
            if not delayed:
                knee = max(knee, SLOW_START * held)
            elif held >= 0.5 * knee:  # the first delay near the slow start's limit ends it
                self._probing[s] = False
                knee = max(held, 0.5 * knee)
        elif not delayed and held >= NEAR_KNEE * knee:  # room at (or past) the knee: probe further
            step = min(STEP_UP * 2.0 ** (self._run[s] / CLIMB_DOUBLING), SLOW_START - 1.0)
            knee = max(knee, min(knee * (1.0 + step * c), SLOW_START * held))
            self._run[s] += c
        elif delayed and 0.5 * knee <= held <= NEAR_KNEE_ABOVE * knee:  # a delay at or below the knee (far
            knee *= 1.0 - STEP_DOWN * c  # below it, one is noise; far above, it is what a knee predicts)
            self._run[s] = 0.0
        self._knee[s] = max(knee, 1.0)
        self._floor[s] = floor
        self.observations += 1

    # -- reading -------------------------------------------------------------------------------------------------

    def knees(self, candidates: IntArray) -> FloatArray:
        """The candidates' knees (NaN: unknown), for /debug/pool and the tests."""
        out = np.full(candidates.size, np.nan)
        known = candidates < self._knee.size
        out[known] = self._knee[candidates[known]]
        return out

    def _note_scrapes(self, snapshot: Snapshot, candidates: IntArray, c: FloatArray) -> None:
        """What each new scrape says, read once per scrape (a snapshot read twice teaches nothing more): our own
        requests in flight when it was taken (in flight now − our picks since), and, fresh, the most requests the
        engine was seen running (every candidate's, picked or not)."""
        if candidates.size == 0:
            return
        if int(candidates.max()) >= self._top.size:
            self._slot(int(candidates.max()), "")
        scraped_at = snapshot.scraped_at[candidates]
        new = (scraped_at != self._seen_at[candidates]) & ~np.isnan(scraped_at)
        if not new.any():
            return
        slots = candidates[new]
        self._interval[slots] = scraped_at[new] - self._seen_at[slots]  # NaN for a first scrape
        self._seen_at[slots] = scraped_at[new]
        self._ours_at_scrape[slots] = snapshot.inflight[slots] - snapshot.picks_since_scrape[slots]
        running = snapshot.running[slots]
        fresh = (c[new] >= 1.0) & (running >= 1.0)  # NaN compares false
        slots, running = slots[fresh], running[fresh]
        self._top[slots] = np.fmax(self._top[slots], running)

    def probing(self, candidates: IntArray) -> BoolArray:
        """Which candidates are still in their slow start (no delay seen near their limit; unknown ones too)."""
        out = np.ones(candidates.size, dtype=bool)
        known = candidates < self._probing.size
        out[known] = self._probing[candidates[known]]
        return out

    def per_endpoint(self, snapshot: Snapshot, candidates: IntArray, now: float, test: bool = True) -> FloatArray:
        """Each candidate's load over its knee (KV use where that is higher). `test`: an untested knee (below the
        load, fresh data, nothing waiting inside, no prefill of ours pending) reads one above the load."""
        t = self.freshness
        age = now - snapshot.scraped_at[candidates]
        c = np.where(age <= t.staleness_s, 1.0, t.staleness_s / np.maximum(age, 1e-12))
        c[np.isnan(age) | (snapshot.scrape_failures[candidates] >= t.max_failures)] = 0.0
        self._note_scrapes(snapshot, candidates, c)
        ours = snapshot.inflight[candidates].astype(np.float64)
        queue = snapshot.effective_queue()[candidates]
        running = np.nan_to_num(snapshot.running[candidates], nan=0.0)
        # The load now: as scraped plus our picks since, but no more than the others' load at that scrape plus
        # ours now (our requests that finished since the scrape are gone; the older the scrape, the more)
        others = np.maximum(running + snapshot.waiting[candidates] - self._ours_at_scrape[candidates], 0.0)
        scraped = np.fmin(running + queue, others + ours)
        scraped[np.isnan(queue)] = np.nan
        known_load = ~np.isnan(scraped)
        load = np.where(known_load, c * np.fmax(scraped, ours) + (1.0 - c) * ours, ours)
        knee = self.knees(candidates)
        probing = self.probing(candidates)
        settled = ~np.isnan(knee) & ~probing
        unknown = np.isnan(knee)
        known = self._knee[~np.isnan(self._knee) & ~self._probing]
        if unknown.any() and known.size:  # a new endpoint borrows the pool's median knee
            knee[unknown] = float(np.median(known))
            settled |= unknown
        # the slow start's knee is also twice the most requests the engine was seen running (held without a queue,
        # as the scrapes show): before any request has finished a pool whose data goes stale still serves
        knee = np.where(probing, np.fmax(knee, SLOW_START * self._top[candidates]), knee)
        cold = c * np.nan_to_num(queue, nan=0.0)  # no knee yet: one request waiting inside the engine is full
        recent = (c >= 1.0) & ~(age > 2.0 * self._interval[candidates])
        # A settled endpoint learns only at first bytes: once its load passes its knee (a slow start ended by a
        # burst's delay at a load the engine holds easily) and every request of ours there has had its first byte,
        # nothing can move the knee until requests finish (a whole request's life: 1.6 s for 200 tokens) and the
        # load falls back under it. With its data fresh, nothing waiting inside it and no prefill of ours pending
        # there, its knee is at least one above its load: one request at a time tests it, clocked by its first
        # byte as TCP's window by its ACKs (undelayed, the climb; delayed, the knee comes down and the queue the
        # request leaves holds the next one back).
        if test:
            untested = settled & recent & ~(queue > 0.0) & (snapshot.prefill_tokens[candidates] <= 0)
            knee = np.where(untested, np.fmax(knee, load + 1.0), knee)
        with np.errstate(invalid="ignore"):
            by_knee = load / knee
        # Whatever room its knee leaves, a settled endpoint whose data is fresh counts full once one request waits
        # inside it (scraped + our picks since), as one with no knee yet does: contention is resolved in the picker's
        # queue, where priority and fairness apply, and dispatch is paced by the scrapes, not sent in bursts that
        # share the engine's steps (and read as delays that pull the knee down). Not once the next scrape is overdue
        # (twice the last interval): our picks since only grow then, and a scrape outage would hold the pool full
        # until its data counts stale; the knee and our bookings count it.
        queued = np.where(recent, np.nan_to_num(queue, nan=0.0), 0.0)
        per = np.where(settled, np.fmax(by_knee, queued), np.where(np.isnan(knee), cold, np.fmin(cold, by_knee)))
        # The slow start also holds between scrapes: a probing endpoint whose data is fresh counts full once its load
        # has grown PACE × from what its last scrape showed it holding (TCP's slow start grows once per round trip),
        # so a burst within one scrape interval cannot jump to a knee learned long before. Not once the next scrape
        # is overdue (twice the last interval), as the queue rule above: the round trip that would show the room has
        # not come, and a scrape outage held a 16-endpoint pool at 1.25× its last scrape until its data counted
        # stale, 2 s later (critical requests waited 0.13-0.23 s in the picker); then the knee and ours alone
        held = np.fmax(np.nan_to_num(snapshot.running[candidates] + snapshot.waiting[candidates], nan=0.0), 1.0)
        paced = probing & known_load & recent & (load >= PACE * held)
        per[paced] = np.fmax(per[paced], 1.0)
        # What the engine itself says: a request waiting in its own queue (its batch or KV is full), KV use. No
        # more waiting than were there at the scrape and may be still: the others' and ours then that have not
        # finished (ours now less our picks since, which the queue above counts): once those have finished, the
        # one that waited among them has run (read as it was, a scrape outage held an endpoint full with nothing
        # of ours in it until its data counted stale, 2 s later)
        left: FloatArray = others + np.maximum(ours - snapshot.picks_since_scrape[candidates], 0.0)
        waiting: FloatArray = np.nan_to_num(np.fmin(snapshot.waiting[candidates], left), nan=0.0) * c
        kv = np.nan_to_num(snapshot.kv_usage[candidates], nan=0.0) * c
        return np.fmax(np.fmax(per, waiting), kv)

    def saturation(self, snapshot: Snapshot, candidates: IntArray, now: float) -> float:
        """The mean over the candidates, each counting at most full while any of them has room: an endpoint past
        its knee has no room, but takes none from the others (unbounded, one at 1.4× held a pool of four at 1.07
        while two sat at 0.97 with nothing pending, and they waited for its requests to finish). With none below
        1.0 the mean as it is, whose excess over a ceiling sizes what eviction reclaims."""
        if candidates.size == 0:
            return 1.0
        per = self.per_endpoint(snapshot, candidates, now)
        return float((np.minimum(per, 1.0) if bool((per < 1.0).any()) else per).mean())

    def saturated(self, snapshot: Snapshot, candidates: IntArray, now: float) -> bool:
        return self.saturation(snapshot, candidates, now) >= 1.0

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray:
        """As a filter: drops endpoints at or over their knee, unless that would drop every candidate (an untested
        knee as learned: where another endpoint has room, a request goes there rather than test one)."""
        kept = candidates[self.per_endpoint(state.snapshot, candidates, state.now, test=False) < 1.0]
        return kept if 0 < kept.size < candidates.size else candidates

    def describe(self) -> dict[str, object]:
        """What /debug/pool shows: the learned knees by address."""
        return {
            a: round(float(k), 1) for a, k in zip(self._address, self._knee, strict=False) if a and not math.isnan(k)
        }


def _confidence(age: float, staleness: float) -> float:
    """1 while the features are usable by age, then staleness / age; 0 for never scraped (inf or NaN)."""
    if not age <= staleness:
        return 0.0 if math.isnan(age) or math.isinf(age) else staleness / age
    return 1.0
