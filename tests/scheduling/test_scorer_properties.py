"""Every registered scorer, over random pools and requests: scores in [0, 1] and finite, picks among candidates.

The list of scorers comes from the registry itself, so a scorer added later without an entry here fails
`test_every_registered_scorer_is_covered`.
"""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.config.decode import parse_config
from epp.scheduling import build_scheduler
from epp.scheduling.framework import CycleState
from epp.scheduling.plugin_type import Kind
from epp.scheduling.registry import builtin_registry
from tests.scheduling.tables import NOW, request, table_with

BASE = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}
RANGE_LABEL = "llm-d.ai/context-length-range"
PRODUCERS = [
    {"type": "token-producer"},
    {"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 4}},
    {"type": "inflight-load-producer"},
    {"type": "session-id-producer"},
]

# (scorer type, its parameters, whether the config also lists the producers)
SCORERS = [
    ("queue-scorer", {}, False),
    ("kv-cache-utilization-scorer", {}, False),
    ("running-requests-size-scorer", {}, False),
    ("inflight-load-scorer", {}, False),
    ("prefix-cache-scorer", {"blockSize": 64}, False),  # the self-contained form
    ("prefix-cache-scorer", {}, False),  # the producer form, its producer auto-created
    ("prefix-cache-scorer", {"matchLengthWeight": 0.4, "matchLengthScaleTokens": 64}, True),
    ("lora-affinity-scorer", {}, False),
    ("session-affinity-scorer", {}, False),
    ("load-aware-scorer", {"threshold": 8}, False),
    ("active-request-scorer", {"idleThreshold": 1, "maxBusyScore": 0.5}, True),
    ("token-load-scorer", {"queueThresholdTokens": 500}, True),
    ("no-hit-lru-scorer", {"lruSize": 3}, True),
    ("prefill-queue-scorer", {}, True),
    ("context-length-aware", {"enableFiltering": True}, False),
    ("precise-prefix-cache-scorer", {}, False),  # its own precise producer (no events: the approximate match)
    # stand-ins (epp.scheduling.stand_ins): 0 for every endpoint
    ("endpoint-attribute-scorer", {"algorithm": {"type": "linear_lower_is_better"}}, False),
    ("topology-affinity-scorer", {}, False),
    ("mm-embeddings-cache-scorer", {}, False),
    # upstream's SLO scorer on our latency model (epp.scheduling.slo): the KV / queue / prefix mix until it has data
    ("latency-scorer", {}, False),
]

metric = st.one_of(st.floats(0, 1e4, allow_nan=False), st.just(math.nan))
row = st.fixed_dictionaries(
    {"waiting": metric, "running": metric, "kv_usage": st.one_of(st.floats(0, 1.2), st.just(math.nan))}
)
label = st.one_of(st.none(), st.sampled_from(["0-100", "50-5000", "0-0", "bad", "10-5"]))
pool = st.lists(st.tuples(row, label, st.integers(0, 4), st.integers(0, 3000)), min_size=1, max_size=12)
prompts = st.lists(st.sampled_from(["", "a", "shared prefix " * 8, "shared prefix " * 8 + "x", "z" * 300]), min_size=1)


def test_every_registered_scorer_is_covered() -> None:
    registry = builtin_registry()
    scorer_types = {n for n in registry.names() if registry.get(n).kind is Kind.SCORER}  # type: ignore[union-attr]
    assert scorer_types == {t for t, _, _ in SCORERS}


def _scheduler(type_name, params, with_producers):
    plugins = [*(PRODUCERS if with_producers else []), {"type": type_name, "parameters": params}]
    doc = {**BASE, "plugins": plugins, "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": type_name}]}]}
    return build_scheduler(parse_config(doc, "cfg.yaml"), seed=3, allow_experimental=True)


@settings(max_examples=40)
@given(endpoints=pool, requests=prompts, subset=st.integers(0, 2**12 - 1), session=st.booleans())
def test_every_scorer_stays_in_the_unit_interval_and_picks_a_candidate(endpoints, requests, subset, session) -> None:
    rows = [r for r, _, _, _ in endpoints]
    labels = [{} if lab is None else {RANGE_LABEL: lab} for _, lab, _, _ in endpoints]
    table = table_with(rows, labels=labels)
    for slot, (_, _, inflight, tokens) in enumerate(endpoints):
        for _ in range(inflight):
            table.book_pick(slot, tokens)
    snap = table.snapshot()
    chosen = [s for s in snap.slots.tolist() if subset >> s & 1] or [0]
    candidates = np.array(chosen, dtype=np.int64)
    for type_name, params, with_producers in SCORERS:
        scheduler = _scheduler(type_name, params, with_producers)
        profile = scheduler.handler.profile
        for i, prompt in enumerate(requests):
            headers = {"x-session-id": f"s{i % 2}"} if session else {}
            req = request(prompt, session=f"tok{i % 2}" if session else None, headers=headers)
            state = CycleState(snap, candidates, req, NOW + i)
            for producer in profile.producers:
                producer.produce(state)
            for weighted in profile.scorers:
                scores = np.asarray(weighted.scorer.score(state, candidates))
                assert scores.shape == candidates.shape, type_name
                assert np.isfinite(scores).all(), (type_name, scores)
                assert ((scores >= 0.0) & (scores <= 1.0)).all(), (type_name, scores)
            picked = scheduler.handler.pick(snap, candidates, req, NOW + i)
            assert set(picked) <= set(chosen), type_name
