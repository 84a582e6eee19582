from collections import Counter

import numpy as np
import pytest

from epp.scheduling.pickers import MaxScorePicker, RandomPicker, WeightedRandomPicker
from tests.scheduling.tables import state, table_with

CANDIDATES = np.array([3, 5, 7, 9], dtype=np.int64)


_STATE = state(table_with([{}] * 10).snapshot())


def _state():
    return _STATE


@pytest.mark.parametrize(
    ("picker", "scores", "expected"),
    [
        pytest.param(MaxScorePicker(seed=1), [0.1, 0.9, 0.5, 0.2], [5], id="max-one"),
        pytest.param(MaxScorePicker(max_endpoints=3, seed=1), [0.1, 0.9, 0.5, 0.2], [5, 7, 9], id="max-fallbacks"),
        pytest.param(MaxScorePicker(max_endpoints=9, seed=1), [0.1, 0.9, 0.5, 0.2], [5, 7, 9, 3], id="max-all"),
        pytest.param(WeightedRandomPicker(seed=1), [0, 0, 1, 0], [7], id="weighted-only-positive"),
    ],
)
def test_picker_table(picker, scores, expected) -> None:
    assert list(picker.pick(_state(), CANDIDATES, np.array(scores))) == expected


def test_max_score_breaks_ties_at_random() -> None:
    picker = MaxScorePicker(seed=7)
    counts = Counter(picker.pick(_state(), CANDIDATES, np.array([1.0, 1.0, 0.0, 1.0]))[0] for _ in range(3000))
    assert set(counts) == {3, 5, 9}
    assert min(counts.values()) > 800


@pytest.mark.parametrize("size", [4, 32, 33, 200], ids=["small", "small-limit", "numpy-limit", "numpy"])
def test_max_score_picks_among_the_scores_within_the_tie_margin_on_both_paths(size: int) -> None:
    picker = MaxScorePicker(seed=5)
    candidates = np.arange(size, dtype=np.int64) * 2
    scores = np.linspace(0.0, 0.5, size)
    scores[[1, size - 1]] = 0.9
    scores[size // 2] = 0.9 - 5e-10  # within 1e-9 of the best: a tie too
    picks = Counter(picker.pick(_state(), candidates, scores)[0] for _ in range(900))
    assert set(picks) == {2, 2 * (size // 2), 2 * (size - 1)}


def test_random_picker_returns_distinct_fallbacks() -> None:
    picks = RandomPicker(max_endpoints=3, seed=3).pick(_state(), CANDIDATES, np.zeros(4))
    assert len(set(picks)) == 3 and set(picks) <= set(CANDIDATES.tolist())


def test_weighted_random_follows_scores_and_falls_back_to_uniform() -> None:
    picker = WeightedRandomPicker(seed=5)
    counts = Counter(picker.pick(_state(), CANDIDATES, np.array([0.0, 3.0, 1.0, 0.0]))[0] for _ in range(4000))
    assert set(counts) == {5, 7}
    assert 2.4 < counts[5] / counts[7] < 3.8
    uniform = Counter(picker.pick(_state(), CANDIDATES, np.zeros(4))[0] for _ in range(4000))
    assert set(uniform) == set(CANDIDATES.tolist())


@pytest.mark.parametrize("cls", [MaxScorePicker, RandomPicker, WeightedRandomPicker], ids=lambda c: c.type_name)
def test_same_seed_same_picks(cls) -> None:
    scores = np.array([0.5, 0.5, 0.5, 0.5])
    p1, p2 = cls(seed=11), cls(seed=11)
    assert [p1.pick(_state(), CANDIDATES, scores)[0] for _ in range(50)] == [
        p2.pick(_state(), CANDIDATES, scores)[0] for _ in range(50)
    ]


@pytest.mark.parametrize("cls", [MaxScorePicker, RandomPicker, WeightedRandomPicker], ids=lambda c: c.type_name)
def test_no_candidates_no_pick(cls) -> None:
    assert list(cls(seed=1).pick(_state(), np.zeros(0, dtype=np.int64), np.zeros(0))) == []
