"""The online latency model: learns each endpoint's TTFT/TPOT from observations, forgets, and predicts a cold
endpoint with the pool's weights."""

from __future__ import annotations

import math

import numpy as np

from epp.datastore.observations import Observation, PickFeatures
from epp.scheduling.latency_model import LatencyModel, features


def _obs(
    slot: int, uncached: int, queue: float, ttft_ms: float, tpot_ms: float, address: str = "", kv: float = math.nan
) -> Observation:
    pick = PickFeatures(uncached, uncached, queue, 4.0, 0.3, int(queue), 0.0, 0.0, 0, kv)
    return Observation(
        slot, address or f"127.10.0.{slot + 1}:8000", pick, ttft_ms / 1e3, tpot_ms / 1e3, 100, True, 0.0, 0.0
    )


def _predict(model: LatencyModel, slot: int, uncached: int, queue: float) -> tuple[float, float]:
    x = features(np.array([float(uncached)]), np.array([queue]), np.array([4.0]), np.array([0.3]), np.array([queue]))
    ttft, tpot = model.predict(np.array([slot]), x)
    return float(ttft[0]), float(tpot[0])


def _train(model: LatencyModel, slot: int, ttft, n: int, seed: int = 0, kv: float = math.nan) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(n):
        uncached, queue = int(rng.integers(100, 4000)), float(rng.integers(0, 20))
        model.observe(_obs(slot, uncached, queue, ttft(uncached, queue), 8.0 + 0.5 * queue, kv=kv))


def test_it_learns_an_endpoints_ttft_and_tpot() -> None:
    model = LatencyModel()
    _train(model, 0, lambda u, q: 20.0 + 0.05 * u + 15.0 * q, 400)
    ttft, tpot = _predict(model, 0, 2000, 10.0)
    assert math.isclose(ttft, 20.0 + 100.0 + 150.0, rel_tol=0.05)
    assert math.isclose(tpot, 13.0, rel_tol=0.05)
    assert model.error[0, 0] < 5.0  # the mean error of its recent predictions, in ms


def test_it_forgets_when_the_model_server_changes() -> None:
    model = LatencyModel()
    _train(model, 0, lambda u, q: 20.0 + 0.05 * u + 15.0 * q, 400)
    _train(model, 0, lambda u, q: 60.0 + 0.2 * u + 40.0 * q, 600, seed=1)  # a slower engine behind the same pod
    ttft, _ = _predict(model, 0, 2000, 10.0)
    assert math.isclose(ttft, 60.0 + 400.0 + 400.0, rel_tol=0.05)


def test_a_cold_endpoint_predicts_with_the_pools_weights() -> None:
    model = LatencyModel()
    for slot in range(3):
        _train(model, slot, lambda u, q: 20.0 + 0.05 * u + 15.0 * q, 200, seed=slot)
    cold, _ = _predict(model, 40, 2000, 10.0)  # a slot never observed
    assert math.isclose(cold, 270.0, rel_tol=0.1)


def test_endpoints_of_one_hardware_class_learn_as_one() -> None:
    fast = lambda u, q: 20.0 + 0.05 * u + 15.0 * q  # noqa: E731
    slow = lambda u, q: 60.0 + 0.4 * u + 40.0 * q  # noqa: E731
    model = LatencyModel()
    _train(model, 0, fast, 600, kv=458_752.0)  # the fast class: most of the observations
    for slot in (1, 2, 3):
        _train(model, slot, slow, 30, seed=slot, kv=36_864.0)
    model.observe(_obs(4, 1000, 5.0, slow(1000, 5.0), 10.0, kv=36_864.0))  # a new member, seen once
    ttft, _ = _predict(model, 4, 2000, 10.0)
    assert math.isclose(ttft, slow(2000, 10.0), rel_tol=0.1)  # its class's, not the pool's (fast-heavy) weights
    unknown = LatencyModel()
    _train(unknown, 0, fast, 600)
    for slot in (1, 2, 3):
        _train(unknown, slot, slow, 30, seed=slot)
    unknown.observe(_obs(4, 1000, 5.0, slow(1000, 5.0), 10.0))
    assert _predict(unknown, 4, 2000, 10.0)[0] < 0.8 * slow(2000, 10.0)  # no class known: the pool's prior
    speed = model.unloaded_ttft(np.array([36_864.0, 458_752.0, 1.0]), 2000)
    assert math.isclose(speed[0], slow(2000, 0.0), rel_tol=0.15)
    assert math.isclose(speed[1], fast(2000, 0.0), rel_tol=0.15)
    assert math.isnan(speed[2])  # a class never observed


def test_a_reused_slot_starts_again_from_the_pool() -> None:
    model = LatencyModel()
    _train(model, 0, lambda u, q: 500.0, 300)
    _train(model, 1, lambda u, q: 10.0, 2000, seed=1)
    model.observe(_obs(0, 1000, 1.0, 10.0, 8.0, address="127.10.0.99:8000"))
    assert model.samples[0, 0] == 1.0
    assert _predict(model, 0, 1000, 1.0)[0] < 100.0


def test_unknown_scraped_signals_count_as_zero_and_predictions_are_never_negative() -> None:
    model = LatencyModel()
    _train(model, 0, lambda u, q: 20.0 + 0.05 * u + 15.0 * q, 200)
    x = features(np.array([0.0]), np.array([math.nan]), np.array([math.nan]), np.array([math.nan]), np.array([0]))
    ttft, tpot = model.predict(np.array([0]), x)
    assert np.isfinite(ttft).all() and (ttft >= 0).all() and (tpot >= 0).all()


def test_the_whole_tables_view_and_a_gathered_subset_predict_the_same() -> None:
    model = LatencyModel()
    for slot in range(4):
        _train(model, slot, lambda u, q, s=slot: 10.0 * (s + 1) + 0.05 * u + 15.0 * q, 100, seed=slot)
    n = 4
    x = features(np.arange(n) * 500.0, np.arange(n, dtype=float), np.full(n, 4.0), np.full(n, 0.3), np.arange(n))
    whole_ttft, whole_tpot = model.predict(np.arange(n), x)
    subset = np.array([1, 3])
    sub_ttft, sub_tpot = model.predict(subset, x[:, subset])
    assert np.allclose(sub_ttft, whole_ttft[subset]) and np.allclose(sub_tpot, whole_tpot[subset])
    beyond, _ = model.predict(np.array([2, 500]), x[:, [2, 2]])  # a slot past the model's capacity: the pool's
    pool = max(float(x[:, 2] @ model.pool_theta[0]), 0.0)
    assert np.isclose(beyond[0], whole_ttft[2]) and np.isclose(beyond[1], pool)


def test_the_sum_of_two_workers_models_predicts_as_one_model_fed_both() -> None:
    both, first, second = LatencyModel(), LatencyModel(), LatencyModel()
    rng = np.random.default_rng(3)
    for k in range(600):
        uncached, queue = int(rng.integers(100, 4000)), float(rng.integers(0, 20))
        obs = _obs(k % 3, uncached, queue, 20.0 + (k % 3) * 30.0 + 0.05 * uncached + 15.0 * queue, 8.0 + 0.5 * queue)
        both.observe(obs)
        (first if k % 2 else second).observe(obs)
    control = LatencyModel()
    addresses = {f"127.10.0.{s + 1}:8000": s + 5 for s in range(3)}  # the control process's own slots
    control.absorb([first.export(), second.export()], addresses.get)
    assert control.observations == 600
    for slot in range(3):
        x = features(np.array([2000.0]), np.array([10.0]), np.array([4.0]), np.array([0.3]), np.array([10]))
        want = both.predict(np.array([slot]), x)[0][0]
        got = control.predict(np.array([slot + 5]), x)[0][0]
        assert math.isclose(got, want, rel_tol=0.05)
    assert set(control.report()["endpoints"]) == set(addresses)  # type: ignore[arg-type]
    control.absorb([first.export()], {"127.10.0.1:8000": 5}.get)  # an endpoint no longer a member is left out
    assert set(control.report()["endpoints"]) == {"127.10.0.1:8000"}  # type: ignore[arg-type]
    control.absorb([], addresses.get)  # no worker has learned: nothing known, the pool's prior alone
    assert control.observations == 0 and control.report()["endpoints"] == {}


def test_split_observations_learn_as_one_that_carries_both_targets() -> None:
    """The first byte's observation (TTFT alone) and the end's (TPOT alone) teach what one with both would."""
    whole, split = LatencyModel(), LatencyModel()
    rng = np.random.default_rng(3)
    for _ in range(300):
        uncached, queue = int(rng.integers(100, 4000)), float(rng.integers(0, 20))
        ttft, tpot = 20.0 + 0.05 * uncached + 15.0 * queue, 8.0 + 0.5 * queue
        whole.observe(_obs(0, uncached, queue, ttft, tpot))
        split.observe(_obs(0, uncached, queue, ttft, math.nan))
        split.observe(_obs(0, uncached, queue, math.nan, tpot))
    for probe in ((500, 2.0), (3000, 15.0)):
        a, b = _predict(whole, 0, *probe), _predict(split, 0, *probe)
        assert math.isclose(a[0], b[0], rel_tol=1e-3) and math.isclose(a[1], b[1], rel_tol=1e-3)


def test_an_observation_without_a_target_leaves_that_targets_weights() -> None:
    model = LatencyModel()
    _train(model, 0, lambda u, q: 20.0 + 0.05 * u, 50)
    before = model.theta[1, 0].copy()
    model.observe(_obs(0, 1000, 3.0, 90.0, math.nan))  # a first byte: TTFT only
    assert np.array_equal(model.theta[1, 0], before)
