"""precise-prefix-cache-producer: the engines' own KV events decide the prefix match; the approximate producer's
answer stands in for an endpoint whose events are absent or stale. Upstream: dataproducer/preciseprefixcache."""

import re
from pathlib import Path

import pytest

from epp.config.decode import parse_config
from epp.config.files import read_config
from epp.errors import ConfigError
from epp.kvevents.decode import AllBlocksCleared, BlockStored
from epp.kvevents.index import KvBlockIndex
from epp.scheduling import build_scheduler
from epp.scheduling.build import deprecations
from epp.scheduling.framework import produced
from epp.scheduling.precise import LocalIndexView, PrecisePrefixCacheProducer
from epp.scheduling.producers import TokenProducer
from tests.scheduling.tables import NOW, request, state, table_with

BASE = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}
TOKENS = tuple(range(100, 164))  # 4 blocks of 16
VLLM = {"type": "token-producer", "parameters": {"modelName": "m", "vllm": {"url": "http://127.0.0.1:8000"}}}


def _config(plugins):
    return parse_config(
        {
            **BASE,
            "plugins": plugins,
            "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "prefix-cache-scorer"}]}],
        },
        "cfg.yaml",
    )


def _stored(tokens, first_hash=1):
    n = len(tokens) // 16
    return BlockStored(list(range(first_hash, first_hash + n)), None, list(tokens), 16)


def _setup(n=3):
    snap = table_with([{}] * n).snapshot()
    index = KvBlockIndex()
    for address in snap.addresses:
        index.add_endpoint(address)
    producer = PrecisePrefixCacheProducer()
    producer.attach(LocalIndexView(index))
    return snap, index, producer


def _produce(producer, snap, now=NOW, tokens=TOKENS):
    TokenProducer(backend="vllm", model_name="m").produce(st := state(snap, request("x" * 256, token_ids=tokens), now))
    producer.produce(st)
    return st, produced(st, producer.name)


def test_match_is_what_the_engines_reported() -> None:
    snap, index, producer = _setup()
    a, b, c = snap.addresses
    index.apply(a, [_stored(TOKENS)], NOW)
    index.apply(b, [_stored(TOKENS[:32])], NOW)
    index.apply(c, [], NOW)  # heard from, holds nothing
    _, match = _produce(producer, snap)
    assert (match.total, match.block_tokens) == (4, 16)
    assert match.matched.tolist() == [4, 2, 0]
    assert producer.fallbacks == {"absent": 0, "stale": 0, "no_tokens": 0}


def test_a_cleared_cache_is_no_longer_matched_though_the_approximate_producer_still_would() -> None:
    snap, index, producer = _setup()
    a = snap.addresses[0]
    for address in snap.addresses:
        index.apply(address, [], NOW)
    index.apply(a, [_stored(TOKENS)], NOW)
    st, match = _produce(producer, snap)
    producer.picked(st, 0)
    index.apply(a, [AllBlocksCleared()], NOW + 1)  # POST /reset_prefix_cache
    st, match = _produce(producer, snap, NOW + 2)
    assert match.matched.tolist() == [0, 0, 0]
    assert produced(st, producer.approx.name).matched.tolist()[0] == 4  # approximate: still believes it


def test_absent_and_stale_endpoints_fall_back_to_the_approximate_match() -> None:
    snap, index, producer = _setup(2)
    a, b = snap.addresses
    index.apply(a, [_stored(TOKENS)], NOW)  # b never publishes
    st, _ = _produce(producer, snap)
    producer.picked(st, 1)  # the approximate producer now credits b
    st, match = _produce(producer, snap, NOW + 1)
    assert match.matched.tolist() == [4, 4]
    assert producer.fallbacks["absent"] == 2
    assert producer.freshness(b, NOW + 1)["fallbackReason"] == "absent"
    # a serves a cache hit (nothing new to store, no event owed): still trusted long after
    producer.picked(st, 0)
    assert producer.trust(a, NOW + 30) is None
    # a is sent a prompt it must store (1,024 new tokens), then its stream stops: stale once staleAfter passes
    st, _ = _produce(producer, snap, NOW + 1, tokens=TOKENS + tuple(range(5000, 6024)))
    producer.picked(st, 0)
    assert producer.trust(a, NOW + 5) is None
    assert producer.trust(a, NOW + 11.5) == "stale"
    assert producer.freshness(a, NOW + 11.5) == {
        "lastEventAgeSeconds": 11.5,
        "precise": False,
        "fallbackReason": "stale",
    }
    index.apply(a, [], NOW + 12)  # the stream resumes
    assert producer.trust(a, NOW + 12) is None


def test_an_idle_engine_that_sends_nothing_stays_trusted() -> None:
    snap, index, producer = _setup(1)
    index.apply(snap.addresses[0], [_stored(TOKENS)], NOW)
    assert producer.trust(snap.addresses[0], NOW + 3600) is None


def test_without_engine_token_ids_every_endpoint_uses_the_approximate_match() -> None:
    snap, index, producer = _setup(1)
    index.apply(snap.addresses[0], [_stored(TOKENS)], NOW)
    st = state(snap, request("x" * 256))
    TokenProducer(backend="vllm", model_name="m").produce(st)  # the render call failed: the estimate stands in
    producer.produce(st)
    assert producer.fallbacks["no_tokens"] == 1
    assert produced(st, producer.name) is produced(st, producer.approx.name)


def test_an_endpoint_first_heard_after_earlier_picks_is_trusted_from_the_next_pick() -> None:
    snap, index, producer = _setup(2)
    a, b = snap.addresses
    index.apply(a, [_stored(TOKENS)], NOW)
    _, match = _produce(producer, snap)
    assert match.matched.tolist() == [4, 0] and producer.fallbacks["absent"] == 1  # b: never heard from
    index.apply(b, [_stored(TOKENS[:16])], NOW + 1)  # b's first batch
    _, match = _produce(producer, snap, NOW + 1)
    assert match.matched.tolist() == [4, 1] and producer.fallbacks["absent"] == 1
    index.remove_endpoint(a)  # a leaves the index: absent again, its slot free
    _, match = _produce(producer, snap, NOW + 2)
    assert match.matched.tolist() == [0, 1] and producer.fallbacks["absent"] == 2


def test_only_candidates_are_judged_and_counted() -> None:
    snap, index, producer = _setup(3)
    a = snap.addresses[0]
    index.apply(a, [_stored(TOKENS)], NOW)  # b and c never publish
    st = state(snap, request("x" * 256, token_ids=TOKENS))
    st.candidates = st.candidates[:1]  # only a may be picked
    TokenProducer(backend="vllm", model_name="m").produce(st)
    producer.produce(st)
    assert producer.fallbacks["absent"] == 0 and producer.precise_picks == 1
    assert produced(st, producer.name).matched.tolist() == [4, 0, 0]


def test_speculative_entries_credit_the_pick_until_its_events_arrive() -> None:
    snap, index, producer = _setup(2)
    producer.speculative = True
    for address in snap.addresses:
        index.apply(address, [], NOW)
    st, match = _produce(producer, snap)
    assert match.matched.tolist() == [0, 0]
    producer.picked(st, 1)
    _, match = _produce(producer, snap, NOW + 1)
    assert match.matched.tolist() == [0, 4]
    _, match = _produce(producer, snap, NOW + 2.5)  # speculativeTTL (2 s) passed
    assert match.matched.tolist() == [0, 0]


def test_upstream_parameters_map_and_the_rest_are_refused_by_name() -> None:
    params = {
        "tokenProcessorConfig": {"blockSize": 64, "hashSeed": "42"},
        "indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": True, "inMemoryConfig": {"size": 1000}}},
        "kvEventsConfig": {"topicFilter": "kv", "podDiscoveryConfig": {"socketPort": 5556, "replaySocketPort": 5559}},
        "speculativeIndexing": True,
    }
    scheduler = build_scheduler(
        _config(
            [
                VLLM,
                {"type": "precise-prefix-cache-producer", "parameters": params},
                {
                    "type": "prefix-cache-scorer",
                    "parameters": {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"},
                },
            ]
        )
    )
    (producer,) = [p for p in scheduler.handler.profile.producers if isinstance(p, PrecisePrefixCacheProducer)]
    assert (producer.block_size, producer.hash_seed, producer.topic_filter) == (64, "42", "kv")
    assert (producer.socket_port, producer.replay_port, producer.max_blocks_per_endpoint) == (5556, 5559, 1000)
    assert producer.speculative
    for bad, word in [
        ({"indexerConfig": {"kvBlockIndexConfig": {"redisConfig": {}}}}, "redisConfig"),
        ({"nonsense": 1}, "nonsense"),
    ]:
        with pytest.raises(ConfigError, match=word):
            build_scheduler(
                _config(
                    [
                        VLLM,
                        {"type": "precise-prefix-cache-producer", "parameters": bad},
                        {"type": "prefix-cache-scorer"},
                    ]
                )
            )


def _precise_warnings(config) -> list[str]:
    return [w for w in deprecations(config) if "(precise-prefix-cache-producer)" in w]


def test_a_central_zmq_endpoint_loads_with_one_warning_and_each_endpoint_is_still_subscribed() -> None:
    """Upstream binds one SUB at zmqEndpoint; here each endpoint is subscribed to, and the file says so once."""
    config = _config(
        [
            VLLM,
            {
                "type": "precise-prefix-cache-producer",
                "parameters": {"kvEventsConfig": {"zmqEndpoint": "tcp://*:5557"}},
            },
            {
                "type": "prefix-cache-scorer",
                "parameters": {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"},
            },
        ]
    )
    (producer,) = [
        p for p in build_scheduler(config).handler.profile.producers if isinstance(p, PrecisePrefixCacheProducer)
    ]
    assert producer.socket_port == 5557
    (warning,) = _precise_warnings(config)
    assert "zmqEndpoint tcp://*:5557" in warning and "approximate fallback" in warning


def test_precise_mode_without_the_engines_tokens_loads_on_its_approximate_fallback_and_says_why() -> None:
    """Upstream estimates tokens too when no vllm token-producer is configured; no block key then matches an
    engine's events, so every pick uses the approximate match, and one warning says why."""
    for plugins, words in [
        ([{"type": "token-producer"}], r"token-producer 'token-producer' uses the estimate backend.*not the engine's"),
        ([], r"token-producer 'token-producer' uses the estimate backend"),  # auto-created, as upstream does
    ]:
        config = _config([*plugins, {"type": "precise-prefix-cache-producer"}, {"type": "prefix-cache-scorer"}])
        scheduler = build_scheduler(config)
        (producer,) = [p for p in scheduler.handler.profile.producers if isinstance(p, PrecisePrefixCacheProducer)]
        assert producer.token_producer == "token-producer"
        (warning,) = _precise_warnings(config)
        assert re.search(words, warning), warning
        snap, _, _ = _setup(2)
        st = state(snap, request("x" * 256))
        TokenProducer().produce(st)
        producer.produce(st)
        assert producer.fallbacks["no_tokens"] == 1


def test_the_scorer_ranks_by_the_precise_match() -> None:
    scheduler = build_scheduler(
        _config(
            [
                {"type": "precise-prefix-cache-producer"},
                VLLM,
                {
                    "type": "prefix-cache-scorer",
                    "parameters": {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"},
                },
            ]
        )
    )
    (producer,) = [p for p in scheduler.handler.profile.producers if isinstance(p, PrecisePrefixCacheProducer)]
    snap, index, _ = _setup(3)
    producer.attach(LocalIndexView(index))
    for address in snap.addresses:
        index.apply(address, [], NOW)
    index.apply(snap.addresses[2], [_stored(TOKENS)], NOW)
    assert scheduler.handler.pick(snap, snap.slots, request("x" * 256, token_ids=TOKENS), NOW)[0] == 2


def test_upstreams_precise_sample_loads() -> None:
    """deploy/config/epp-precise-prefix-cache-config.yaml: token-producer → precise producer → prefix-cache-scorer."""
    config = read_config(Path(__file__).parents[1] / "data/epp-configs/llmd-router-precise-prefix-cache-config.yaml")
    scheduler = build_scheduler(config)
    (producer,) = [p for p in scheduler.handler.profile.producers if isinstance(p, PrecisePrefixCacheProducer)]
    assert (producer.block_size, producer.socket_port, producer.topic_filter) == (64, 5557, "kv@")


def test_the_deprecated_precise_scorer_reads_its_own_producer_or_the_configs() -> None:
    """precise-prefix-cache-scorer (upstream, deprecated): with no precise producer in the config it builds one of
    its own from its parameters; with one, it is a prefix-cache-scorer reading that producer."""

    def profile(plugins):
        doc = {
            **BASE,
            "plugins": plugins,
            "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "precise-prefix-cache-scorer"}]}],
        }
        return build_scheduler(parse_config(doc, "cfg.yaml")).handler.profile

    params = {"tokenProcessorConfig": {"blockSize": 32}}
    own = profile([VLLM, {"type": "precise-prefix-cache-scorer", "parameters": params}])
    (producer,) = [p for p in own.producers if isinstance(p, PrecisePrefixCacheProducer)]
    assert producer.block_size == 32 and producer.name == "precise-prefix-cache-scorer"
    assert own.scorers[0].scorer.producer == producer.name
    shared = profile([VLLM, {"type": "precise-prefix-cache-producer"}, {"type": "precise-prefix-cache-scorer"}])
    (producer,) = [p for p in shared.producers if isinstance(p, PrecisePrefixCacheProducer)]
    assert producer.name == "precise-prefix-cache-producer"
    assert [s.scorer.producer for s in shared.scorers] == ["precise-prefix-cache-producer"]
