"""The engine model's latency responds to load, prefix hits, batch size and LoRA slots as designed (virtual time)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.sim.engine import Engine, Finished, SimRequest
from epp.sim.profiles import H100_LLAMA_8B, L4_LLAMA_8B, EngineProfile

P = H100_LLAMA_8B


def run(profile: EngineProfile, arrivals: list[tuple[float, SimRequest]]) -> tuple[dict[int, Finished], Engine]:
    """Drive one engine in virtual time: submit at arrival times, step while busy."""
    engine = Engine(profile)
    pending = sorted(arrivals, key=lambda a: a[0])
    now, i, done = 0.0, 0, {}
    while i < len(pending) or engine.busy:
        while i < len(pending) and pending[i][0] <= now:
            engine.submit(pending[i][1], pending[i][0])
            i += 1
        if not engine.busy:
            now = pending[i][0]
            continue
        now += engine.begin_step(now)
        for fin in engine.end_step(now).finished:
            done[fin.request_id] = fin
    return done, engine


def req(
    rid: int, prompt: int = 8192, output: int = 16, group: int | None = None, lora: str | None = None
) -> SimRequest:
    units = tuple(hash(("g", group, u)) for u in range(prompt // 512)) if group is not None else ()
    return SimRequest(rid, prompt, output, prefix=units, unit_tokens=512, lora=lora)


def ttft(f: Finished) -> float:
    return f.first_token_at - f.arrived


@pytest.mark.parametrize(
    ("prompt", "expected_s"),
    [(512, 512 / 20_000), (8192, 8192 / 20_000), (32768, 32768 / 20_000)],
    ids=["512-tokens", "8k-tokens", "32k-tokens-chunked"],
)
def test_idle_ttft_is_prefill_time_of_the_prompt(prompt: int, expected_s: float) -> None:
    done, _ = run(P, [(0.0, req(1, prompt))])
    steps = -(-prompt // P.max_batched_tokens)
    assert ttft(done[1]) == pytest.approx(expected_s + steps * (P.step_base_s + P.step_per_seq_s))


def test_a_cached_prefix_skips_its_prefill() -> None:
    done, engine = run(P, [(0.0, req(1, group=7)), (5.0, req(2, group=7)), (10.0, req(3, group=8))])
    assert ttft(done[2]) < ttft(done[1]) / 10
    assert ttft(done[3]) == pytest.approx(ttft(done[1]))
    assert done[2].cached_tokens == 8192 and done[3].cached_tokens == 0
    assert engine.prefix_hits_tokens == 8191  # a fully cached prompt still computes its last token


@pytest.mark.parametrize("queued", [1, 4, 16], ids=["1-ahead", "4-ahead", "16-ahead"])
def test_ttft_grows_with_the_queue_ahead(queued: int) -> None:
    arrivals = [(0.0, req(i)) for i in range(queued)] + [(0.0, req(99))]
    done, _ = run(P, arrivals)
    assert ttft(done[99]) >= (queued + 1) * 8192 * P.prefill_s_per_token


@pytest.mark.parametrize("batch", [1, 32, 256], ids=["batch-1", "batch-32", "batch-256"])
def test_decode_step_time_grows_with_batch_size(batch: int) -> None:
    done, _ = run(P, [(0.0, req(i, prompt=16, output=101)) for i in range(batch)])
    per_token = [(f.finished_at - f.first_token_at) / 100 for f in done.values()]
    floor = P.step_base_s + batch * P.step_per_seq_s
    assert min(per_token) >= floor


def test_max_num_seqs_caps_the_batch() -> None:
    small = dataclasses.replace(P, max_num_seqs=2)
    done, _ = run(small, [(0.0, req(i, prompt=16, output=50)) for i in range(3)])
    assert done[2].first_token_at >= done[0].finished_at


def test_lru_eviction_forgets_the_oldest_prefix_when_the_cache_is_full() -> None:
    tiny = dataclasses.replace(P, num_blocks=3 * 8192 // 16)  # three 8k prompts' worth of blocks
    arrivals = [(float(t), req(t, output=1, group=t)) for t in range(4)] + [(10.0, req(10, output=1, group=0))]
    arrivals.append((11.0, req(11, output=1, group=3)))
    done, _ = run(tiny, arrivals)
    assert done[10].cached_tokens == 0  # group 0 was the least recently used, evicted for group 3
    assert done[11].cached_tokens == 8192


def test_kv_usage_counts_held_blocks_and_drops_to_zero_when_idle() -> None:
    engine = Engine(P)
    engine.submit(req(1, prompt=8192, output=10), 0.0)
    engine.end_step(engine.begin_step(0.0))
    assert engine.kv_usage == pytest.approx((8192 + 10) / 16 / P.num_blocks, rel=0.01)
    assert engine.num_running == 1 and engine.num_waiting == 0
    now = 1.0
    while engine.busy:
        now += engine.begin_step(now)
        engine.end_step(now)
    assert engine.kv_usage == 0.0


def test_lora_slots_hold_back_a_fifth_adapter() -> None:
    two = dataclasses.replace(P, max_loras=2)
    arrivals = [(0.0, req(i, prompt=16, output=40, lora=f"a{i}")) for i in range(3)]
    done, _ = run(two, arrivals)
    assert done[2].first_token_at >= min(done[0].finished_at, done[1].finished_at)


def test_slower_profile_is_slower() -> None:
    fast, _ = run(P, [(0.0, req(1))])
    slow, _ = run(L4_LLAMA_8B, [(0.0, req(1))])
    assert ttft(slow[1]) > 5 * ttft(fast[1])


@pytest.mark.parametrize(
    "bad",
    [SimRequest(1, 0, 1), SimRequest(1, 10, 0), SimRequest(1, 100, 1, prefix=(1,), unit_tokens=512)],
    ids=["empty-prompt", "no-output", "prefix-longer-than-prompt"],
)
def test_malformed_requests_are_refused_with_a_reason(bad: SimRequest) -> None:
    with pytest.raises(ValueError, match="request 1"):
        Engine(P).submit(bad, 0.0)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 2), st.integers(1, 4000), st.integers(1, 60), st.integers(0, 5)), min_size=1, max_size=30
    )
)
def test_every_request_finishes_once_and_blocks_balance(spec: list[tuple[float, int, int, int]]) -> None:
    tight = dataclasses.replace(P, num_blocks=2000, max_num_seqs=8)
    arrivals = []
    for i, (t, prompt, output, group) in enumerate(spec):
        prefix = tuple(hash(("h", group, u)) for u in range(prompt // 512))
        arrivals.append((t, SimRequest(i, prompt, output, prefix=prefix, unit_tokens=512)))
    done, engine = run(tight, arrivals)
    assert sorted(done) == list(range(len(spec)))
    assert all(f.arrived <= f.first_token_at <= f.finished_at for f in done.values())
    assert engine.kv_usage == 0.0 and not engine.busy
    assert engine.generation_tokens_total == sum(o for _, _, o, _ in spec)


@pytest.mark.parametrize("phase", ["waiting", "prefilling", "decoding"])
def test_an_aborted_request_frees_its_seat_and_blocks(phase: str) -> None:
    engine = Engine(dataclasses.replace(P, max_num_seqs=1))
    engine.submit(req(1, prompt=16384, output=20), 0.0)
    engine.submit(req(2, prompt=16, output=5), 0.0)
    now = engine.begin_step(0.0)
    engine.end_step(now)  # request 1 is half-way through its prefill, request 2 waits for the only seat
    if phase == "decoding":
        now += engine.begin_step(now)
        engine.end_step(now)
    victim = 2 if phase == "waiting" else 1
    assert engine.abort(victim) and not engine.abort(99)
    done = {}
    while engine.busy:
        now += engine.begin_step(now)
        done.update({f.request_id: f for f in engine.end_step(now).finished})
    assert sorted(done) == [3 - victim]
    assert engine.kv_usage == 0.0 and engine.requests_aborted == 1


def test_an_abort_during_a_step_applies_after_it() -> None:
    engine = Engine(P)
    engine.submit(req(1, prompt=512, output=10), 0.0)
    now = engine.begin_step(0.0)
    engine.abort(1)
    engine.end_step(now)  # the step in flight still completes
    while engine.busy:
        now += engine.begin_step(now)
        assert not engine.end_step(now).finished
    assert engine.kv_usage == 0.0 and engine.requests_aborted == 1
