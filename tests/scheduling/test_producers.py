"""Producers, the producer form of prefix-cache-scorer, the new filters, and how the config wires them.

Each test's docstring names the llm-d-router file the behaviour comes from.
"""

import numpy as np
import pytest

from epp.config.decode import parse_config
from epp.errors import ConfigError
from epp.scheduling import build_scheduler
from epp.scheduling.affinity_filter import PrefixCacheAffinityFilter
from epp.scheduling.framework import InflightLoad, PrefixMatch, produced, publish
from epp.scheduling.load_scorers import ProducedPrefixScorer
from epp.scheduling.prefix import PrefixCacheScorer
from epp.scheduling.producers import (
    ApproxPrefixCacheProducer,
    BurstPrefixCacheProducer,
    InflightLoadProducer,
    SessionIdProducer,
    TokenProducer,
    estimate_tokens,
)
from epp.scheduling.registry import builtin_registry
from tests.scheduling.tables import NOW, request, state, table_with

BASE = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}


def _config(plugins, profile_refs):
    return parse_config(
        {**BASE, "plugins": plugins, "schedulingProfiles": [{"name": "p", "plugins": profile_refs}]}, "cfg.yaml"
    )


def test_estimate_backend_is_four_bytes_per_token() -> None:
    """dataproducer/tokenizer/README.md: the estimate backend approximates ≈4 bytes per token."""
    assert [estimate_tokens(p) for p in ("", "a", "abcd", "abcde", "é" * 4)] == [0, 1, 1, 2, 2]
    snap = table_with([{}]).snapshot()
    st = state(snap, request("x" * 40))
    TokenProducer().produce(st)
    tokens = produced(st, "token-producer")
    assert (tokens.n_tokens, tokens.exact) == (10, False)


def test_token_ids_the_request_carries_win_over_the_estimate() -> None:
    """tokenizer/README.md: Generate requests carry final tokens; the render backend's ids are the engine's."""
    snap = table_with([{}]).snapshot()
    st = state(snap, request("x" * 40, token_ids=(1, 2, 3)))
    TokenProducer(backend="vllm", model_name="m").produce(st)
    tokens = produced(st, "token-producer")
    assert (tokens.n_tokens, tokens.exact, tokens.data) == (3, True, np.array([1, 2, 3], "<u4").tobytes())


def test_approx_prefix_producer_defaults_are_upstreams() -> None:
    """dataproducer/approximateprefix/types.go L100-132: blockSizeTokens 16, maxPrefixTokensToMatch 131072,
    maxPrefixBlocksToMatch 2048, lruCapacityPerServer 31250 (the tokens cap wins: 131072 / 16 blocks)."""
    p = builtin_registry().get("approx-prefix-cache-producer")
    config = _config(
        [{"type": "approx-prefix-cache-producer"}, {"type": "prefix-cache-scorer"}],
        [{"pluginRef": "prefix-cache-scorer"}],
    )
    scheduler = build_scheduler(config)
    token, producer = scheduler.handler.profile.producers  # its token-producer auto-created, as upstream's
    assert p is not None and isinstance(producer, ApproxPrefixCacheProducer) and isinstance(token, TokenProducer)
    assert (producer.block_tokens, producer.max_tokens, producer.max_blocks) == (16, 131072, 2048)
    assert producer.index.default_capacity == 31250
    assert producer.block_cap(16) == 8192
    producer.max_tokens = 0
    assert producer.block_cap(16) == 2048


def test_approx_prefix_producer_learns_the_pick_in_token_blocks() -> None:
    """approximateprefix/README.md: hashes the tokens into blocks, writes PrefixCacheMatchInfo per endpoint,
    records the chosen endpoint after the pick."""
    snap = table_with([{}, {}]).snapshot()
    producer = ApproxPrefixCacheProducer(auto_tune=False)
    prompt = "y" * (64 * 5 + 10)  # 82 estimated tokens: 5 whole blocks of 16
    st = state(snap, request(prompt))
    producer.produce(st)
    match = produced(st, producer.name)
    assert (match.total, match.block_tokens, match.matched.tolist()) == (5, 16, [0.0, 0.0])
    producer.picked(st, 1)
    again = state(snap, request(prompt[: 64 * 3] + "z" * 200))
    producer.produce(again)
    assert produced(again, producer.name).matched.tolist() == [0.0, 3.0]


def test_prefix_scorer_old_form_is_the_self_contained_scorer() -> None:
    """prefix/plugin.go history: the old parameters (blockSize, maxPrefixBlocksToMatch, lruCapacityPerServer,
    autoTune) still load, as our self-contained scorer (the built-in profiles name it by its blockSize)."""
    for params in ({"blockSize": 64}, {"blockSize": 64, "autoTune": False}, {"maxPrefixBlocksToMatch": 8}):
        config = _config(
            [{"type": "prefix-cache-scorer", "parameters": params}], [{"pluginRef": "prefix-cache-scorer"}]
        )
        profile = build_scheduler(config).handler.profile
        assert isinstance(profile.scorers[0].scorer, PrefixCacheScorer)
        assert profile.producers == ()


def test_prefix_scorer_new_form_auto_creates_the_default_producer() -> None:
    """approximateprefix/README.md: with no producer configured the framework creates the default one, and the
    token-producer it consumes (wellknown_configs_test.go: optimized-baseline, flow-control); no parameters at all
    is the new form too, as upstream's scorer has only that one."""
    for params in ({"matchLengthWeight": 0.3, "matchLengthScaleTokens": 8192}, {}):
        config = _config(
            [{"type": "prefix-cache-scorer", "parameters": params}], [{"pluginRef": "prefix-cache-scorer"}]
        )
        profile = build_scheduler(config).handler.profile
        assert isinstance(profile.scorers[0].scorer, ProducedPrefixScorer)
        assert [type(p) for p in profile.producers] == [TokenProducer, ApproxPrefixCacheProducer]


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"matchLengthWeight": 0.5}, "matchLengthScaleTokens"),
        ({"matchLengthWeight": 1.5}, "must be <= 1"),
        ({"prefixMatchInfoProducerName": "nope"}, "names producer 'nope'"),
        ({"prefixMatchInfoProducerName": "queue-scorer"}, "is not a producer"),
        ({"blockSize": 64, "matchLengthWeight": 0.1}, "do not mix"),
    ],
)
def test_prefix_scorer_refusals_name_the_field(params, words) -> None:
    """prefix/plugin.go factory: matchLengthWeight in [0, 1]; matchLengthScaleTokens > 0 when the weight is > 0."""
    config = _config(
        [{"type": "queue-scorer"}, {"type": "prefix-cache-scorer", "parameters": params}],
        [{"pluginRef": "prefix-cache-scorer"}],
    )
    with pytest.raises(ConfigError, match=words):
        build_scheduler(config)


def test_upstreams_current_default_profile_routes_a_repeated_prompt_back() -> None:
    """approx-prefix-cache-producer + prefix-cache-scorer + queue + kv (upstream's current default): the second
    request with the same prompt goes where the first went."""
    config = _config(
        [
            {"type": "approx-prefix-cache-producer"},
            {
                "type": "prefix-cache-scorer",
                "parameters": {"prefixMatchInfoProducerName": "approx-prefix-cache-producer"},
            },
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
        ],
        [
            {"pluginRef": "prefix-cache-scorer", "weight": 3},
            {"pluginRef": "queue-scorer", "weight": 2},
            {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
        ],
    )
    scheduler = build_scheduler(config, seed=1)
    snap = table_with([{"waiting": 0, "kv_usage": 0.1}] * 4).snapshot()
    prompt = "system prompt " * 100
    first = scheduler.handler.pick(snap, snap.slots, request(prompt + "a"), NOW)[0]
    assert all(scheduler.handler.pick(snap, snap.slots, request(prompt + s), NOW)[0] == first for s in "bcd")


def test_inflight_load_producer_reads_the_tables_bookings() -> None:
    """dataproducer/inflightload/README.md: in-flight requests and tokens per endpoint."""
    table = table_with([{}, {}])
    table.book_pick(1, 300)
    table.book_pick(1, 100)
    snap = table.snapshot()
    st = state(snap, request("x" * 8))
    InflightLoadProducer().produce(st)
    load = produced(st, "inflight-load-producer")
    assert (load.requests.tolist(), load.tokens.tolist(), load.request_tokens) == ([0, 2], [0, 400], 2)
    table.release_pick(1, 300)
    assert table.snapshot().inflight_tokens.tolist() == [0, 100]


def test_session_id_producer_binds_and_expires() -> None:
    """dataproducer/sessionid/README.md: header x-session-id by default; the pick binds the session; reads and
    writes refresh the TTL; a binding idle longer than ttl is gone."""
    snap = table_with([{}, {}]).snapshot()
    producer = SessionIdProducer(ttl_s=10.0)
    st = state(snap, request("p", headers={"x-session-id": "s1"}))
    producer.produce(st)
    assert produced(st, producer.name).address is None
    producer.picked(st, 1)
    later = state(snap, request("p", headers={"x-session-id": "s1"}), now=NOW + 9)
    producer.produce(later)
    assert produced(later, producer.name).address == snap.addresses[1]
    expired = state(snap, request("p", headers={"x-session-id": "s1"}), now=NOW + 30)
    producer.produce(expired)
    assert produced(expired, producer.name).address is None
    none = state(snap, request("p"))
    producer.produce(none)
    assert produced(none, producer.name) is None
    cookie = SessionIdProducer(header=None, cookie="sid")
    st = state(snap, request("p", headers={"cookie": "a=1; sid=abc"}))
    cookie.produce(st)
    assert produced(st, cookie.name).session_id == "abc"


def test_burst_producer_keeps_a_group_together_up_to_max_per_replica() -> None:
    """dataproducer/burstprefix/README.md: identical prompts inside the window are steered onto one replica,
    filling it to maxPerReplica before spilling to the next least-loaded one; full match there, zero elsewhere."""
    snap = table_with([{"waiting": 0}, {"waiting": 1}, {"waiting": 5}]).snapshot()
    producer = BurstPrefixCacheProducer(window_s=0.1, max_per_replica=2, block_tokens=4)
    prompt = "rollout prompt " * 10
    chosen = []
    for i, slot in enumerate([2, None, None, None]):
        st = state(snap, request(prompt), now=NOW + i * 0.01)
        producer.produce(st)
        match = produced(st, producer.name)
        target = int(np.argmax(match.matched)) if match.matched.any() else slot
        assert target is not None
        chosen.append(target)
        producer.picked(st, target)
    assert chosen == [2, 2, 0, 0]  # the first went where other scorers sent it; then filled, then least loaded
    late = state(snap, request(prompt), now=NOW + 1.0)  # the window is over: no affinity
    producer.produce(late)
    assert not produced(late, producer.name).matched.any()


def test_burst_producer_is_alpha() -> None:
    """cmd/epp/runner/runner.go: burst-prefix-cache-producer is registered with StabilityAlpha."""
    config = _config(
        [{"type": "burst-prefix-cache-producer"}, {"type": "queue-scorer"}], [{"pluginRef": "queue-scorer"}]
    )
    with pytest.raises(ConfigError, match="--allow-experimental-plugins"):
        build_scheduler(config)
    assert build_scheduler(config, allow_experimental=True).handler.profile.producers


def test_tokenizer_is_the_deprecated_name_of_token_producer() -> None:
    """upstream-2026 §1: `tokenizer` is a deprecated alias of `token-producer`."""
    from epp.scheduling.build import deprecations

    config = _config([{"type": "tokenizer"}, {"type": "queue-scorer"}], [{"pluginRef": "queue-scorer"}])
    assert isinstance(build_scheduler(config).handler.profile.producers[0], TokenProducer)
    assert any("use 'token-producer'" in w for w in deprecations(config))


def test_vllm_token_producer_needs_a_model_name() -> None:
    """tokenizer/README.md: modelName is required for vllm."""
    config = _config([{"type": "token-producer", "parameters": {"vllm": {"url": "http://127.0.0.1:1"}}}], [])
    with pytest.raises(ConfigError, match="modelName"):
        build_scheduler(config)


@pytest.mark.parametrize(
    ("ratios", "ttft_tokens", "penalty", "expected"),
    [
        ([0.9, 0.5, 0.0], [0, 0, 0], 18000, [0]),  # sticky kept
        ([0.5, 0.1, 0.0], [0, 0, 0], 18000, [0, 1, 2]),  # nobody sticky: all kept
        ([0.9, 0.0, 0.0], [400_000, 0, 0], 18000, [0, 1, 2]),  # sticky ~25 s behind: stickiness breaks
        ([0.9, 0.0, 0.0], [400_000, 0, 0], 0, [0]),  # 0 = always stick
    ],
)
def test_prefix_cache_affinity_filter(ratios, ttft_tokens, penalty, expected) -> None:
    """scheduling/filter/prefixcacheaffinity/README.md: keep score >= affinityThreshold (0.80), all when none
    passes; TTFT gate inFlightTokens / peakPrefillThroughput (15928) × 1000 ms vs maxTTFTPenaltyMs."""
    snap = table_with([{}] * 3).snapshot()
    st = state(snap)
    publish(st, "approx-prefix-cache-producer", PrefixMatch(np.array(ratios) * 10, 10, 16))
    publish(st, "inflight-load-producer", InflightLoad(np.zeros(3, int), np.array(ttft_tokens), 0))
    plugin = PrefixCacheAffinityFilter(max_penalty_ms=penalty)
    assert plugin.filter(st, snap.slots).tolist() == expected


def test_prefix_cache_affinity_filter_exploration_skips_the_gate() -> None:
    """prefixcacheaffinity/README.md: with probability explorationProbability the gate is skipped."""
    snap = table_with([{}] * 2).snapshot()
    plugin = PrefixCacheAffinityFilter(exploration=1.0)
    st = state(snap)
    publish(st, "approx-prefix-cache-producer", PrefixMatch(np.array([10.0, 0.0]), 10, 16))
    assert plugin.filter(st, snap.slots).tolist() == [0, 1]


@pytest.mark.parametrize(
    ("selector", "kept"),
    [
        ({"matchLabels": {"tier": "gold"}}, [0, 1]),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}, [0, 2]),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, [1, 2, 3]),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, [0, 1, 2]),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, [3]),
        (
            {"matchLabels": {"tier": "gold"}, "matchExpressions": [{"key": "zone", "operator": "In", "values": ["c"]}]},
            [1],
        ),
    ],
)
def test_label_selector_filter(selector, kept) -> None:
    """runner.go registers label-selector-filter (matchLabels + matchExpressions), Kubernetes selector semantics:
    NotIn and DoesNotExist keep endpoints without the key."""
    labels = [{"tier": "gold", "zone": "a"}, {"tier": "gold", "zone": "c"}, {"zone": "b"}, {}]
    snap = table_with([{}] * 4, labels=labels).snapshot()
    for type_name in ("label-selector-filter", "label-filter"):
        config = _config([{"type": type_name, "parameters": selector}], [{"pluginRef": type_name}])
        (plugin,) = build_scheduler(config).handler.profile.filters
        assert plugin.filter(state(snap), snap.slots).tolist() == kept


@pytest.mark.parametrize(
    "expression",
    [
        {"key": "a", "operator": "Near"},
        {"key": "a", "operator": "In"},
        {"key": "a", "operator": "Exists", "values": ["x"]},
    ],
)
def test_label_selector_refuses_a_bad_expression(expression) -> None:
    """Kubernetes LabelSelectorRequirement: In/NotIn need values, Exists/DoesNotExist take none."""
    config = _config(
        [{"type": "label-selector-filter", "parameters": {"matchExpressions": [expression]}}],
        [{"pluginRef": "label-selector-filter"}],
    )
    with pytest.raises(ConfigError, match="matchExpressions"):
        build_scheduler(config)


def test_check_config_lists_an_auto_created_producer_as_added() -> None:
    """approximateprefix/README.md: the framework creates the default producer a consumer needs."""
    from epp.scheduling.build import effective_plugins

    config = _config(
        [
            {
                "type": "prefix-cache-scorer",
                "parameters": {"prefixMatchInfoProducerName": "approx-prefix-cache-producer"},
            }
        ],
        [{"pluginRef": "prefix-cache-scorer"}],
    )
    added = {p.type_name for p in effective_plugins(config) if p.implicit}
    assert "approx-prefix-cache-producer" in added


def test_approx_prefix_producer_tells_its_picks_and_learns_another_workers() -> None:
    """As the self-contained prefix scorer: a pick's blocks go to `on_pick` (a serving worker's pick log), and
    `learn` records a pick another worker made, so the next matching prompt finds that endpoint."""
    snap = table_with([{}, {}]).snapshot()
    told: list[tuple[int, list[int]]] = []
    producer = ApproxPrefixCacheProducer(auto_tune=False)
    producer.on_pick = lambda slot, hashes: told.append((slot, hashes))
    st = state(snap, request("a shared prompt, long enough for several token blocks " * 4))
    producer.produce(st)
    producer.picked(st, 1)
    ((slot, hashes),) = told
    assert slot == 1 and hashes
    other = ApproxPrefixCacheProducer(auto_tune=False)
    other.learn(snap, 0, hashes)
    st = state(snap, request("a shared prompt, long enough for several token blocks " * 4))
    other.produce(st)
    assert produced(st, other.name).matched.tolist() == [len(hashes), 0]
