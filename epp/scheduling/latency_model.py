"""Online latency prediction from the picker's own observations: per endpoint, TTFT and TPOT as linear functions
of what the pick sees (uncached prompt tokens, queue, running, KV use, our requests in flight), learned by
exponentially-forgetting ridge regression.

Why this shape. Upstream trains a model in a sidecar from the same inputs; here every routed request already is a
sample in the deciding process (`epp.datastore.observations`), so a few numbers per endpoint suffice:

- per endpoint and target (TTFT, TPOT) the forgetting sums A = Σ λᵏ x xᵀ and b = Σ λᵏ x y, and the weights
  θ = (A + ρI)⁻¹ (b + ρ θ_class): with little data an endpoint predicts as its hardware class does, and with data
  its own samples outweigh the prior. A class is the endpoints of one KV capacity (engine metadata: scraped blocks
  × block size), its weights θ_class = (Σ_class A + ρ/10 I)⁻¹ (Σ_class b + ρ/10 θ_pool) from every member's sums,
  so 26 endpoints of one kind learn as one while each has seen only a few requests; an endpoint of unknown class
  (none scraped) and one never observed predict with the pool-wide weights;
- λ < 1 forgets: after a model-server change the old samples fade within ~1/(1 − λ) requests, and the ridge term
  keeps the solve well-posed however little an input varies (no covariance wind-up, which plain RLS has);
- a prediction is one row-wise dot product over the candidates (numpy, no Python loop per endpoint); the solves
  happen on observations (one d×d solve per observed target, a batched solve of every endpoint now and then).

Pure: no clock, no I/O; time is only what the observations carry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from epp.datastore.observations import Observation
from epp.datastore.table import FloatArray, IntArray

D = 7  # features: 1, uncached k-tokens, queue/10, running/100, KV use, our in-flight/10, its prompt 10k-tokens
TTFT, TPOT = 0, 1
_SCALE = np.array([1.0, 1e-3, 0.1, 0.01, 1.0, 0.1, 1e-4])
_SCALE_ROWS = _SCALE[:, None].copy()
_REFRESH_EVERY = 64  # observations between batched solves of every endpoint (pool prior moves for cold ones)
_ERROR_DECAY = 0.05  # weight of a new error in the exponentially-weighted mean error


def features(
    uncached: FloatArray | IntArray,
    queue: FloatArray,
    running: FloatArray,
    kv_usage: FloatArray,
    inflight: IntArray | FloatArray,
    inflight_tokens: IntArray | FloatArray | float = 0.0,
) -> FloatArray:
    """The (D, n) design matrix of n picks, one feature a row (what `predict` multiplies row-wise, no transpose);
    an unknown (NaN) scraped signal counts as 0 (our in-flight is always known, so a stale endpoint is still told
    apart by the load we sent it). Five numpy calls whatever n: a pick's cost is its calls, not their arithmetic."""
    x = np.empty((D, len(queue)))
    x[0] = 1.0
    x[1:6] = (uncached, queue, running, kv_usage, inflight)
    x[6] = inflight_tokens  # the prompt work sent ahead: what its prefill queues behind
    # fmax(NaN, 0) is 0: the scraped signals' unknowns become 0 (none is negative), then every row scaled at once
    np.fmax(x, 0.0, out=x)
    x *= _SCALE_ROWS
    return x


class LearnedSums(NamedTuple):
    """What one process's model has learned, by endpoint address: its forgetting sums, which add up across
    processes (each serving worker learns from the requests it served), for another process's `absorb`."""

    addresses: tuple[str, ...]
    a: FloatArray  # (2, k, D, D)
    b: FloatArray  # (2, k, D)
    samples: FloatArray  # (2, k)
    error: FloatArray  # (2, k)
    predicted: FloatArray  # (2, k)
    pool_a: FloatArray  # (2, D, D)
    pool_b: FloatArray  # (2, D)
    pool_error: FloatArray  # (2,)
    observations: int
    capacity: FloatArray  # (k,) each endpoint's class key (KV capacity in tokens; NaN unknown)


class LatencyModel:
    """Per-slot TTFT and TPOT predictors (milliseconds) with a pool-wide prior; bounded state: O(slots × D²)."""

    def __init__(self, forget: float = 0.99, pool_forget: float = 0.998, ridge: float = 1.0) -> None:
        if not (0.0 < forget <= 1.0 and 0.0 < pool_forget <= 1.0) or ridge <= 0:
            raise ValueError("forget factors must be in (0, 1], ridge positive")
        self.forget, self.pool_forget, self.ridge = forget, pool_forget, ridge
        self._eye = np.eye(D)
        self._cap = 0
        self._a = np.zeros((2, 0, D, D))
        self._b = np.zeros((2, 0, D))
        self._weights = np.zeros((2, D, 0))  # θ feature-major, so a pick's dot products read contiguous rows
        self.theta = self._weights.transpose(0, 2, 1)  # (2, slots, D): a view, writes go to `_weights`
        self.samples = np.zeros((2, 0))  # forgetting count of samples per slot (how much its own data weighs)
        self.error = np.full((2, 0), math.nan)  # mean |predicted − observed| ms, exponentially weighted
        self.predicted = np.full((2, 0), math.nan)  # the last prediction made for each slot's observed request
        self.capacity = np.full(0, math.nan)  # per slot its KV capacity in tokens, the class key (NaN: unknown)
        self._classes: dict[float, FloatArray] = {}  # class key → its weights (2, D), as of the last solve
        # class key → its members' summed A (2, D, D) and b (2, D), kept up to date per observation (O(D²))
        self._class_sums: dict[float, tuple[FloatArray, FloatArray]] = {}
        self._address: list[str] = []
        self._pool_a = np.zeros((2, D, D))
        self._pool_b = np.zeros((2, D))
        self.pool_theta = np.zeros((2, D))
        self.pool_error = np.full(2, math.nan)
        self.observations = 0
        self._since_refresh = 0
        self._noted: dict[int, int] = {}  # slot → uncached tokens of its last pick (the director asks once)

    # -- the pick's side ----------------------------------------------------------------------------------------

    def predict(self, slots: IntArray, x: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Predicted (TTFT ms, TPOT ms) per column of `x` (`features`) on `slots`; a slot never seen predicts with
        the pool's weights. Never negative. Both targets in one einsum over the feature-major weights (a view when
        the slots are 0..n-1, the common case of a whole table)."""
        weights = self._weights
        n = slots.size
        cap = self._cap
        if 0 < n <= cap and slots[0] == 0 and slots[-1] == n - 1:  # slots 0..n-1: a view, no gather
            w = weights[:, :, :n]
        elif cap == 0:
            w = np.broadcast_to(self.pool_theta[:, :, None], (2, D, n))
        else:
            inside = slots < cap
            w = weights[:, :, np.where(inside, slots, 0)]
            if not bool(inside.all()):
                w[:, :, ~inside] = self.pool_theta[:, :, None]
        both: FloatArray = np.einsum("tdn,dn->tn", w, x)
        np.fmax(both, 0.0, out=both)
        return both[TTFT], both[TPOT]

    def note_pick(self, slot: int, uncached_tokens: int) -> None:
        """The pick just made put a request with this many uncached prompt tokens on `slot` (the director reads it
        back for the request's observation, in the same call: bounded to one entry per slot)."""
        self._noted[slot] = uncached_tokens

    def uncached(self, slot: int, prompt_tokens: int) -> int:
        """`Scheduler.uncached`: what `note_pick` said of this pick, else every prompt token."""
        return self._noted.pop(slot, prompt_tokens)

    # -- the feed's side ----------------------------------------------------------------------------------------

    def observe(self, obs: Observation) -> None:
        """Learn one observation (ObservationSink): the targets it carries (its first byte's TTFT, its end's TPOT)."""
        slot = obs.slot
        if slot < 0:
            return
        self._ensure(slot)
        if slot >= len(self._address) or self._address[slot] != obs.address:
            self._reset(slot, obs.address)
        p = obs.pick
        key = p.capacity_tokens
        if key == key and key > 0 and key != self.capacity[slot]:
            self._move(slot, key)
        key = float(self.capacity[slot])
        before_a, before_b = self._a[:, slot].copy(), self._b[:, slot].copy()
        x = features(
            np.array([p.uncached_tokens], dtype=np.float64),
            np.array([p.queue]),
            np.array([p.running]),
            np.array([p.kv_usage]),
            np.array([p.inflight], dtype=np.float64),
            np.array([p.inflight_tokens], dtype=np.float64),
        )[:, 0]
        outer = np.outer(x, x)
        learned: list[int] = []  # the targets this observation carries (the first byte's: TTFT; the end's: TPOT)
        for target, value in ((TTFT, obs.ttft_s), (TPOT, obs.tpot_s)):
            if value != value or value < 0:
                continue
            y = value * 1000.0
            guess = max(float(x @ self.theta[target, slot]), 0.0)
            self.predicted[target, slot] = guess
            err = abs(guess - y)
            old = self.error[target, slot]
            self.error[target, slot] = err if old != old else old + _ERROR_DECAY * (err - old)
            pool_old = self.pool_error[target]
            self.pool_error[target] = err if pool_old != pool_old else pool_old + _ERROR_DECAY * (err - pool_old)
            lam, pool_lam = self.forget, self.pool_forget
            self._a[target, slot] = lam * self._a[target, slot] + outer
            self._b[target, slot] = lam * self._b[target, slot] + x * y
            self.samples[target, slot] = lam * self.samples[target, slot] + 1.0
            self._pool_a[target] = pool_lam * self._pool_a[target] + outer
            self._pool_b[target] = pool_lam * self._pool_b[target] + x * y
            self.pool_theta[target] = np.linalg.solve(
                self._pool_a[target] + 0.1 * self.ridge * self._eye, self._pool_b[target]
            )
            learned.append(target)
        if not learned:
            return
        if key == key:
            class_sums = self._class_sums[key]  # in place: the arrays are the class's
            class_sums[0][...] += self._a[:, slot] - before_a
            class_sums[1][...] += self._b[:, slot] - before_b
        prior = self._class_prior(slot)
        for target in learned:  # a target not observed keeps its weights until the next refresh
            self.theta[target, slot] = self._solve(target, slot, prior[target])
        self.observations += 1
        self._since_refresh += 1
        if self._since_refresh >= _REFRESH_EVERY:
            self._refresh()

    def _solve(self, target: int, slot: int, prior: FloatArray) -> FloatArray:
        ridge = self.ridge
        out: FloatArray = np.linalg.solve(
            self._a[target, slot] + ridge * self._eye, self._b[target, slot] + ridge * prior
        )
        return out

    def _class_prior(self, slot: int) -> FloatArray:
        """The (2, D) weights of `slot`'s class, solved again from its members' sums now (the pool's: unknown)."""
        key = float(self.capacity[slot])
        if key != key:
            return self.pool_theta
        weights = self._class_solve(*self._class_sums[key])
        self._classes[key] = weights
        return weights

    def _move(self, slot: int, key: float) -> None:
        """`slot` now belongs to class `key` (NaN: none): its sums leave its old class's and join the new one's."""
        old = float(self.capacity[slot])
        if old == old:
            old_sums = self._class_sums[old]
            old_sums[0][...] -= self._a[:, slot]
            old_sums[1][...] -= self._b[:, slot]
        self.capacity[slot] = key
        if key == key:
            if key not in self._class_sums:
                self._class_sums[key] = (np.zeros((2, D, D)), np.zeros((2, D)))
            new_sums = self._class_sums[key]
            new_sums[0][...] += self._a[:, slot]
            new_sums[1][...] += self._b[:, slot]

    def _sum_classes(self) -> None:
        """Every class's sums from its members' again (after an absorb; on refresh, so no rounding accumulates)."""
        self._class_sums = {}
        for key in np.unique(self.capacity[~np.isnan(self.capacity)]).tolist():
            members = self.capacity == key
            self._class_sums[key] = (self._a[:, members].sum(axis=1), self._b[:, members].sum(axis=1))

    def _class_solve(self, a: FloatArray, b: FloatArray) -> FloatArray:
        """(2, D) class weights from the class's summed (2, D, D) and (2, D) sums, the pool's as the prior."""
        soft = 0.1 * self.ridge
        out = np.linalg.solve(a + soft * self._eye, (b + soft * self.pool_theta)[..., None])[..., 0]
        return np.asarray(out, dtype=np.float64)

    def _refresh(self) -> None:
        """Every slot's weights again, against its class's prior as it is now (the classes solved again too; a
        slot of unknown class and a cold one follow the pool)."""
        self._since_refresh = 0
        ridge = self.ridge
        priors = np.repeat(self.pool_theta[:, None, :], self._cap, axis=1)  # (2, slots, D)
        self._sum_classes()
        self._classes = {}
        for key, sums in self._class_sums.items():
            weights = self._class_solve(*sums)
            self._classes[key] = weights
            priors[:, self.capacity == key] = weights[:, None, :]
        for target in (TTFT, TPOT):
            lhs = self._a[target] + ridge * self._eye
            rhs = self._b[target] + ridge * priors[target]
            self.theta[target] = np.linalg.solve(lhs, rhs[..., None])[..., 0]

    def unloaded_ttft(self, keys: FloatArray, prompt_tokens: int) -> FloatArray:
        """Per class key (KV capacity in tokens), the class's predicted TTFT (ms) of a prompt of `prompt_tokens`
        uncached tokens on an idle endpoint: how fast that hardware is, whatever its load now (NaN: a class not
        learned yet)."""
        x = features(np.array([float(prompt_tokens)]), np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1))[:, 0]
        out = np.full(keys.size, math.nan)
        for i, key in enumerate(keys.tolist()):
            weights = self._classes.get(key)
            if weights is not None:
                out[i] = float(weights[TTFT] @ x)
        return out

    def _ensure(self, slot: int) -> None:
        if slot < self._cap:
            return
        cap = max(slot + 1, 2 * self._cap, 8)
        grow = cap - self._cap
        self._a = np.concatenate([self._a, np.zeros((2, grow, D, D))], axis=1)
        self._b = np.concatenate([self._b, np.zeros((2, grow, D))], axis=1)
        self._weights = np.concatenate([self._weights, np.repeat(self.pool_theta[:, :, None], grow, axis=2)], axis=2)
        self.theta = self._weights.transpose(0, 2, 1)
        self.samples = np.concatenate([self.samples, np.zeros((2, grow))], axis=1)
        self.error = np.concatenate([self.error, np.full((2, grow), math.nan)], axis=1)
        self.predicted = np.concatenate([self.predicted, np.full((2, grow), math.nan)], axis=1)
        self.capacity = np.concatenate([self.capacity, np.full(grow, math.nan)])
        self._cap = cap

    def _reset(self, slot: int, address: str) -> None:
        """A slot now holding another endpoint (or seen for the first time) starts from the pool prior."""
        while len(self._address) <= slot:
            self._address.append("")
        self._address[slot] = address
        self._move(slot, math.nan)
        self._a[:, slot] = 0.0
        self._b[:, slot] = 0.0
        self.theta[:, slot] = self.pool_theta
        self.samples[:, slot] = 0.0
        self.error[:, slot] = math.nan
        self.predicted[:, slot] = math.nan

    # -- across processes ---------------------------------------------------------------------------------------

    def export(self) -> LearnedSums:
        """What this model has learned, by address (copies: the caller may send them to another process)."""
        keep = np.array([s for s, address in enumerate(self._address) if address], dtype=np.int64)
        return LearnedSums(
            tuple(self._address[s] for s in keep.tolist()),
            self._a[:, keep],
            self._b[:, keep],
            self.samples[:, keep],
            self.error[:, keep],
            self.predicted[:, keep],
            self._pool_a.copy(),
            self._pool_b.copy(),
            self.pool_error.copy(),
            self.observations,
            self.capacity[keep],
        )

    def absorb(self, parts: Sequence[LearnedSums], slot_of: Callable[[str], int | None]) -> None:
        """This model becomes the sum of `parts` (the serving workers' models, the control process's own learning
        nothing): per endpoint, placed by `slot_of(address)` (None: not a member here, left out), the sums added,
        the error their sample-weighted mean, the last prediction any part's; the pool's sums added likewise; then
        every slot solved again. What this model held before is replaced."""
        placed = [
            np.array([-1 if (slot := slot_of(address)) is None else slot for address in part.addresses], np.int64)
            for part in parts
        ]
        top = max((int(slots.max(initial=-1)) for slots in placed), default=-1)
        if top >= 0:
            self._ensure(top)
        self._a[:] = 0.0
        self._b[:] = 0.0
        self.samples[:] = 0.0
        self.predicted[:] = math.nan
        self.capacity[:] = math.nan
        addresses = [""] * self._cap
        weighted = np.zeros_like(self.samples)
        self._pool_a = np.zeros((2, D, D))
        self._pool_b = np.zeros((2, D))
        pool_errors = []
        for part, slots in zip(parts, placed, strict=True):
            self._pool_a += part.pool_a
            self._pool_b += part.pool_b
            pool_errors.append(part.pool_error)
            ok = slots >= 0
            at = slots[ok]
            for j, slot in zip(np.flatnonzero(ok).tolist(), at.tolist(), strict=True):
                addresses[slot] = part.addresses[j]
            # `+=` on a gather: no slot twice in one part (one address each, one slot each)
            self._a[:, at] += part.a[:, ok]
            self._b[:, at] += part.b[:, ok]
            self.samples[:, at] += part.samples[:, ok]
            weighted[:, at] += np.nan_to_num(part.error[:, ok]) * part.samples[:, ok]
            predicted = part.predicted[:, ok]
            self.predicted[:, at] = np.where(np.isnan(predicted), self.predicted[:, at], predicted)
            known = part.capacity[ok]
            self.capacity[at] = np.where(np.isnan(known), self.capacity[at], known)
        self._address = addresses
        with np.errstate(invalid="ignore", divide="ignore"):
            self.error = np.where(self.samples > 0, weighted / self.samples, math.nan)
        errors = np.array(pool_errors).reshape(-1, 2)
        counted = (~np.isnan(errors)).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.pool_error = np.where(counted > 0, np.nansum(errors, axis=0) / counted, math.nan)
        self.observations = sum(part.observations for part in parts)
        for target in (TTFT, TPOT):
            self.pool_theta[target] = np.linalg.solve(
                self._pool_a[target] + 0.1 * self.ridge * self._eye, self._pool_b[target]
            )
        self._refresh()

    def report(self) -> dict[str, object]:
        """What /debug/pool and /metrics show: per endpoint that has learned, its samples (forgetting count), mean
        absolute error and last prediction (ms) for each target; the pool's error and the observations so far."""
        endpoints: dict[str, object] = {}
        for slot, address in enumerate(self._address):
            if not address:
                continue
            endpoints[address] = {
                name: {
                    "samples": round(float(self.samples[target, slot]), 2),
                    "meanAbsErrorMs": _rounded(self.error[target, slot]),
                    "lastPredictedMs": _rounded(self.predicted[target, slot]),
                }
                for name, target in (("ttft", TTFT), ("tpot", TPOT))
            }
        pool = {
            name: {"meanAbsErrorMs": _rounded(self.pool_error[target])}
            for name, target in (("ttft", TTFT), ("tpot", TPOT))
        }
        return {"observations": self.observations, "pool": pool, "endpoints": endpoints}


def absorb_all(
    models: Sequence[LatencyModel], per_worker: Sequence[Sequence[LearnedSums]], slot_of: Callable[[str], int | None]
) -> None:
    """Each of `models` (a config's producers, in order) becomes the sum of the workers' models in its place."""
    for i, model in enumerate(models):
        model.absorb([sums[i] for sums in per_worker if len(sums) > i], slot_of)


def _rounded(value: float) -> float | None:
    return None if value != value else round(float(value), 3)
