"""The engine model: a vLLM-style continuous-batching server, pure and clock-free.

One object models one server. The caller owns time: it calls `begin_step(now)` to plan the next engine step (which
returns how long the step takes) and `end_step(now)` when that time has passed, which applies the step and returns
the requests that got their first token or finished. The HTTP simulator drives it with asyncio sleeps; the quality
benchmark drives many of them from one event heap in virtual time. Same code, same numbers.

What it models, after vLLM V1's scheduler:
- continuous batching: up to `max_num_seqs` sequences; each step carries one decode token per decoding sequence and
  fills the rest of a `max_batched_tokens` budget with prefill chunks, oldest first (chunked prefill);
- a KV cache of `num_blocks` blocks of `block_size` tokens with prefix caching: a prompt's leading units are
  chain-hashed; units already computed are reused (no prefill), the rest are computed and then cached; units no
  sequence holds are evicted least-recently-used first when blocks run short;
- prefill time proportional to uncached prompt tokens; step time = base + per-sequence + KV-read terms;
- LoRA: at most `max_loras` distinct adapters in the running batch; a request for another adapter waits.

Simplifications (docs/simulator.md): the blocks for a request's output are reserved at admission, so there is no
preemption; admission is first-come-first-served with head-of-line blocking on KV space, as in vLLM.

Cost: a step is O(admissions + prefill chunks + completions); decode progress is a shared step counter, and
completions come from a heap keyed by the step they finish in, so a batch of 256 decoding sequences costs nothing
per sequence per step.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import NamedTuple

from epp.sim.profiles import EngineProfile


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request as the engine sees it: token counts and the chain hashes of its prompt's leading units.

    `prefix[i]` identifies the first (i+1) × `unit_tokens` tokens of the prompt (a chain hash, so equal values mean
    equal prefixes); tokens past the last unit are never shared. `unit_tokens` must be a multiple of the block size.
    """

    request_id: int
    prompt_tokens: int
    output_tokens: int
    prefix: tuple[int, ...] = ()
    unit_tokens: int = 16
    lora: str | None = None
    token_ids: tuple[int, ...] = ()  # the prompt's token ids, where KV events are published (they carry them)
    # P/D: the prompt's KV was computed by a prefill server and pulled here (the caller waited the transfer time);
    # only the first token is computed, as for a fully cached prompt, and the blocks become this server's cache.
    remote_prefill: bool = False


class KvStored(NamedTuple):
    """Units a request's prefill made reusable: `units` of them from unit `first` (a KV-event record)."""

    req: SimRequest
    first: int
    units: int


class KvRemoved(NamedTuple):
    """Units evicted, by hash."""

    hashes: tuple[int, ...]


class KvCleared(NamedTuple):
    """The whole prefix cache was reset."""


KvRecord = KvStored | KvRemoved | KvCleared


@dataclass(slots=True)
class _Seq:
    req: SimRequest
    arrived: float
    matched_units: int = 0
    held_units: list[int] = field(default_factory=list)  # cached units this sequence holds a reference on
    private_blocks: int = 0
    to_prefill: int = 0
    prefilled: int = 0
    decode_start: int = -1  # step counter when the first token came out
    queued_estimate: int = 0  # uncached prompt tokens as of arrival (the oracle's view of the queue)
    first_token_at: float = -1.0


@dataclass(frozen=True, slots=True)
class Finished:
    request_id: int
    arrived: float
    first_token_at: float
    finished_at: float
    output_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class StepOutcome:
    first_tokens: tuple[int, ...]  # request ids whose first token came out in this step
    finished: tuple[Finished, ...]


class Engine:
    """One simulated server. Not thread-safe; time is always an argument."""

    def __init__(self, profile: EngineProfile) -> None:
        self.profile = profile
        self._waiting: deque[_Seq] = deque()
        self._prefilling: list[_Seq] = []
        self._decoding: dict[int, _Seq] = {}
        self._finish_heap: list[tuple[int, int]] = []  # (finish step, request id)
        self._seqs: dict[int, _Seq] = {}
        self._units: dict[int, list[int]] = {}  # unit hash → [refcount, blocks]
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached units nobody holds, oldest first
        self._held_blocks = 0
        self._idle_blocks = 0
        self._ctx_tokens = 0  # context tokens of decoding sequences (the KV-read term)
        self._waiting_estimate = 0  # Σ queued_estimate over waiting sequences
        self._step = 0
        self._plan: list[tuple[_Seq, int]] | None = None
        self._plan_decodes = 0
        self._loras_resident: OrderedDict[str, None] = OrderedDict()
        self._aborts: list[int] = []  # asked for while a step was in flight; applied before the next one
        # None: nobody listens. A list: the cache's stores, evictions and resets are appended, oldest first, for a
        # publisher to drain (the HTTP simulator's KV-event publisher, the virtual-time benchmark's feed).
        self.kv_events: list[KvRecord] | None = None
        self.requests_aborted = 0
        # counters, as the metrics page reports them
        self.prefix_queries_tokens = 0
        self.prefix_hits_tokens = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_finished = 0
        self.remote_prefills = 0  # P/D: requests whose prompt KV came from a prefill server

    # -- state the metrics page and the oracle read ----------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._prefilling) + len(self._decoding)

    @property
    def kv_usage(self) -> float:
        """Share of blocks held by running sequences (cached blocks nobody holds count as free, as in vLLM)."""
        return self._held_blocks / self.profile.num_blocks

    @property
    def busy(self) -> bool:
        return bool(self._waiting or self._prefilling or self._decoding)

    @property
    def stepping(self) -> bool:
        return self._plan is not None

    def running_loras(self) -> tuple[str, ...]:
        seen = {s.req.lora for s in self._prefilling if s.req.lora}
        seen.update(s.req.lora for s in self._decoding.values() if s.req.lora)
        return tuple(sorted(x for x in seen if x))

    def waiting_loras(self) -> tuple[str, ...]:
        return tuple(sorted({s.req.lora for s in self._waiting if s.req.lora}))

    def cached_units(self, req: SimRequest) -> int:
        """How many of the request's leading units this server has computed (its prefix-cache hit)."""
        n = 0
        units = self._units
        for h in req.prefix:
            if h not in units:
                break
            n += 1
        return n

    def queued_prefill_tokens(self) -> int:
        """Prompt tokens still to compute, in progress or waiting: the work ahead of a new request's prefill.

        Waiting requests count their uncached tokens as of their arrival, so a query costs O(requests in prefill)
        rather than O(queue), which matters when the oracle asks every server on every arrival under overload.
        """
        ahead = sum(s.to_prefill - s.prefilled for s in self._prefilling)
        return ahead + self._waiting_estimate

    def tokens_generated(self, request_id: int) -> int:
        """Output tokens produced so far for a request (0 before its first token)."""
        seq = self._seqs.get(request_id)
        if seq is None or seq.decode_start < 0:
            return 0
        return min(seq.req.output_tokens, self._step - seq.decode_start + 1)

    def step_estimate(self, extra_prefill: int = 0) -> float:
        """Duration of a step with the current batch plus `extra_prefill` prompt tokens (the oracle's unit)."""
        p = self.profile
        seqs = self.num_running + (1 if extra_prefill else 0)
        prefill = min(extra_prefill, max(0, p.max_batched_tokens - len(self._decoding)))
        return (
            p.step_base_s
            + p.step_per_seq_s * seqs
            + p.kv_read_s_per_token * self._ctx_tokens
            + p.prefill_s_per_token * prefill
        )

    # -- input --------------------------------------------------------------------------------------------------

    def submit(self, req: SimRequest, now: float) -> None:
        if req.prompt_tokens <= 0 or req.output_tokens <= 0:
            raise ValueError(f"request {req.request_id}: token counts must be positive")
        if req.request_id in self._seqs:
            raise ValueError(f"request {req.request_id} is already in the engine")
        if len(req.prefix) * req.unit_tokens > req.prompt_tokens or req.unit_tokens % self.profile.block_size:
            raise ValueError(f"request {req.request_id}: prefix units must fit the prompt and align to blocks")
        if self._blocks(req.prompt_tokens + req.output_tokens) > self.profile.num_blocks:
            raise ValueError(f"request {req.request_id}: longer than the whole KV cache")
        seq = _Seq(req=req, arrived=now, queued_estimate=self._uncached(req))
        self._waiting_estimate += seq.queued_estimate
        self._seqs[req.request_id] = seq
        self._waiting.append(seq)

    def abort(self, request_id: int) -> bool:
        """Drop a request (its client went away), freeing its seat and blocks, as vLLM does; False if unknown.

        While a step is in flight the request may be part of it, so the drop waits for the step's end.
        """
        if request_id not in self._seqs:
            return False
        if self._plan is None:
            self._drop(self._seqs[request_id])
        else:
            self._aborts.append(request_id)
        return True

    def _drop(self, seq: _Seq) -> None:
        rid = seq.req.request_id
        if rid in self._decoding:
            del self._decoding[rid]  # its finish-heap entry is skipped when it comes up
            self._ctx_tokens -= seq.req.prompt_tokens + self.tokens_generated(rid)
            self._release(seq)
        elif seq in self._prefilling:
            self._prefilling.remove(seq)
            self._release(seq)
        else:
            self._waiting.remove(seq)
            self._waiting_estimate -= seq.queued_estimate
        del self._seqs[rid]
        self.requests_aborted += 1

    # -- stepping -----------------------------------------------------------------------------------------------

    def begin_step(self, now: float) -> float:
        """Plan the next step (admissions, prefill chunks, decodes); returns its duration. Call only when busy."""
        if self._plan is not None:
            raise RuntimeError("begin_step called twice without end_step")
        for rid in self._aborts:
            seq = self._seqs.get(rid)
            if seq is not None:
                self._drop(seq)
        self._aborts.clear()
        p = self.profile
        budget = p.max_batched_tokens - len(self._decoding)
        plan: list[tuple[_Seq, int]] = []
        for seq in self._prefilling:
            if budget <= 0:
                break
            chunk = min(seq.to_prefill - seq.prefilled, budget)
            plan.append((seq, chunk))
            budget -= chunk
        lora_loads = 0
        skipped: list[_Seq] = []
        while self._waiting and budget > 0 and self.num_running < p.max_num_seqs:
            seq = self._waiting[0]
            lora = seq.req.lora
            if lora is not None and lora not in self._loras_resident and not self._lora_slot_free():
                skipped.append(self._waiting.popleft())  # vLLM skips it and looks further down the queue
                if len(skipped) >= 64:
                    break
                continue
            if not self._admit(seq):
                break  # head-of-line: no KV space for the oldest request
            self._waiting.popleft()
            self._waiting_estimate -= seq.queued_estimate
            if lora is not None and lora not in self._loras_resident:
                lora_loads += 1
                self._loras_resident[lora] = None
                if len(self._loras_resident) > p.max_loras:
                    self._loras_resident.popitem(last=False)
            self._prefilling.append(seq)
            chunk = min(seq.to_prefill, budget)
            plan.append((seq, chunk))
            budget -= chunk
        self._waiting.extendleft(reversed(skipped))
        prefill_tokens = sum(c for _, c in plan)
        self._plan = plan
        self._plan_decodes = len(self._decoding)
        return (
            p.step_base_s
            + p.step_per_seq_s * (len(plan) + self._plan_decodes)
            + p.kv_read_s_per_token * self._ctx_tokens
            + p.prefill_s_per_token * prefill_tokens
            + p.lora_load_s * lora_loads
        )

    def end_step(self, now: float) -> StepOutcome:
        """Apply the planned step at its end time `now`: tokens out, prefills done, finished requests freed."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("end_step called without begin_step")
        self._plan = None
        self._step += 1
        self._ctx_tokens += self._plan_decodes
        self.generation_tokens_total += self._plan_decodes
        first: list[int] = []
        finished: list[Finished] = []
        done_prefill = False
        for seq, chunk in plan:
            seq.prefilled += chunk
            if seq.prefilled >= seq.to_prefill:
                done_prefill = True
                self._register_units(seq)
                seq.decode_start = self._step
                seq.first_token_at = now
                first.append(seq.req.request_id)
                self.generation_tokens_total += 1
                self._decoding[seq.req.request_id] = seq
                self._ctx_tokens += seq.req.prompt_tokens + 1
                heapq.heappush(self._finish_heap, (self._step + seq.req.output_tokens - 1, seq.req.request_id))
        if done_prefill:
            self._prefilling = [s for s in self._prefilling if s.prefilled < s.to_prefill]
        heap = self._finish_heap
        while heap and heap[0][0] <= self._step:
            _, rid = heapq.heappop(heap)
            gone = self._decoding.pop(rid, None)
            if gone is not None:  # None: aborted while decoding
                finished.append(self._finish(gone, now))
        return StepOutcome(tuple(first), tuple(finished))

    # -- KV cache -----------------------------------------------------------------------------------------------

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.profile.block_size)

    def _uncached(self, req: SimRequest) -> int:
        if req.remote_prefill:
            return 1
        return max(1, req.prompt_tokens - self.cached_units(req) * req.unit_tokens)

    def _lora_slot_free(self) -> bool:
        return len(self.running_loras()) < self.profile.max_loras

    def _admit(self, seq: _Seq) -> bool:
        """Take blocks for a waiting request (reusing its cached prefix); False when the cache cannot hold it."""
        req = seq.req
        units = self._units
        matched = self.cached_units(req)
        unit_blocks = req.unit_tokens // self.profile.block_size
        revived = sum(unit_blocks for h in req.prefix[:matched] if units[h][0] == 0)
        private = self._blocks(req.prompt_tokens + req.output_tokens) - matched * unit_blocks
        if self._held_blocks + revived + private > self.profile.num_blocks:
            return False
        for h in req.prefix[:matched]:
            entry = units[h]
            if entry[0] == 0:
                del self._lru[h]
                self._idle_blocks -= entry[1]
                self._held_blocks += entry[1]
            entry[0] += 1
        self._held_blocks += private
        self._evict(self._held_blocks + self._idle_blocks - self.profile.num_blocks)
        seq.matched_units = matched
        seq.held_units = list(req.prefix[:matched])
        seq.private_blocks = private
        cached = matched * req.unit_tokens
        seq.to_prefill = max(1, req.prompt_tokens - cached)  # a fully cached prompt still computes its last token
        if req.remote_prefill:
            seq.to_prefill = 1  # the KV arrived from the prefill server
            self.remote_prefills += 1
        self.prefix_queries_tokens += req.prompt_tokens
        self.prefix_hits_tokens += min(cached, req.prompt_tokens - 1) if cached else 0
        self.prompt_tokens_total += req.prompt_tokens
        return True

    def _evict(self, blocks_over: int) -> None:
        gone: list[int] = []
        while blocks_over > 0 and self._lru:
            h, _ = self._lru.popitem(last=False)
            size = self._units.pop(h)[1]
            self._idle_blocks -= size
            blocks_over -= size
            gone.append(h)
        if gone and self.kv_events is not None:
            self.kv_events.append(KvRemoved(tuple(gone)))

    def reset_prefix_cache(self) -> None:
        """Forget every cached unit, as vLLM's `POST /reset_prefix_cache`: idle ones are freed, and those running
        sequences hold become theirs alone (still held, no longer shareable), so the reset always succeeds."""
        units = self._units
        for seq in (*self._prefilling, *self._decoding.values()):
            seq.private_blocks += sum(units[h][1] for h in seq.held_units)
            seq.held_units = []
        units.clear()
        self._lru.clear()
        self._idle_blocks = 0
        if self.kv_events is not None:
            self.kv_events.append(KvCleared())

    def _register_units(self, seq: _Seq) -> None:
        """A finished prefill makes the prompt's remaining units reusable (moved from private to shared blocks)."""
        req = seq.req
        unit_blocks = req.unit_tokens // self.profile.block_size
        units = self._units
        run_start = -1
        for i in range(seq.matched_units, len(req.prefix)):
            h = req.prefix[i]
            if h in units:  # computed meanwhile by another sequence: ours stays private
                if run_start >= 0 and self.kv_events is not None:
                    self.kv_events.append(KvStored(req, run_start, i - run_start))
                run_start = -1
                continue
            units[h] = [1, unit_blocks]
            seq.held_units.append(h)
            seq.private_blocks -= unit_blocks
            if run_start < 0:
                run_start = i
        if run_start >= 0 and self.kv_events is not None:
            self.kv_events.append(KvStored(req, run_start, len(req.prefix) - run_start))

    def _release(self, seq: _Seq) -> None:
        """Give back a sequence's blocks: its own ones, and its references on cached units (idle ones go LRU)."""
        units = self._units
        for h in seq.held_units:
            entry = units[h]
            entry[0] -= 1
            if entry[0] == 0:
                self._lru[h] = None
                self._held_blocks -= entry[1]
                self._idle_blocks += entry[1]
        self._held_blocks -= seq.private_blocks

    def _finish(self, seq: _Seq, now: float) -> Finished:
        self._release(seq)
        self._ctx_tokens -= seq.req.prompt_tokens + seq.req.output_tokens
        del self._seqs[seq.req.request_id]
        self.requests_finished += 1
        return Finished(
            request_id=seq.req.request_id,
            arrived=seq.arrived,
            first_token_at=seq.first_token_at,
            finished_at=now,
            output_tokens=seq.req.output_tokens,
            cached_tokens=seq.matched_units * seq.req.unit_tokens,
        )
