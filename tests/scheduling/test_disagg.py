"""Disaggregated scheduling: the deciders, the disagg profile handler and its deprecated forms, the director's
answer (destination = decode, the sidecar's headers, both endpoints booked and released), and a property over
roles, subset hints and residency."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.config.decode import parse_config
from epp.director import Director
from epp.errors import ConfigError, EppError
from epp.scheduling import build_scheduler
from epp.scheduling.build import deprecations
from epp.scheduling.disagg import (
    DATA_PARALLEL_HEADER,
    PREFILLER_HEADER,
    AlwaysDisaggDecider,
    DisaggScheduler,
    PrefixBasedDecider,
    StagedPick,
)
from epp.scheduling.framework import PrefixMatch, TokenizedPrompt, produced, publish
from epp.scheduling.producers import TOKEN_PRODUCER
from tests.federation.builders import registry, router
from tests.scheduling.tables import NOW, address, request, state, table_with

BASE = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}
ROLE = "llm-d.ai/role"


def pd_config(decider: dict[str, Any] | None, handler: dict[str, Any] | None = None, **extra: Any) -> Any:
    """Upstream's P/D sample shape: prefill and decode profiles over role filters, prefix + queue scorers."""
    plugins: list[dict[str, Any]] = [
        {"type": "approx-prefix-cache-producer"},
        {"type": "prefix-cache-scorer"},
        {"type": "queue-scorer"},
        {"type": "prefill-filter"},
        {"type": "decode-filter"},
        {"type": "max-score-picker"},
        handler or {"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "decider"}}},
    ]
    if decider is not None:
        plugins.append({"name": "decider", **decider})

    def profile(name: str, role_filter: str) -> dict[str, Any]:
        refs = [{"pluginRef": role_filter}, {"pluginRef": "prefix-cache-scorer", "weight": 2}]
        return {"name": name, "plugins": [*refs, {"pluginRef": "queue-scorer"}, {"pluginRef": "max-score-picker"}]}

    doc = {
        **BASE,
        "plugins": plugins,
        "schedulingProfiles": [profile("prefill", "prefill-filter"), profile("decode", "decode-filter")],
        **extra,
    }
    return parse_config(doc, "pd.yaml")


ALWAYS = {"type": "always-disagg-pd-decider"}


def prefix_decider(non_cached: int, prompt_tokens: int | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"nonCachedTokens": non_cached}
    if prompt_tokens is not None:
        params["promptTokens"] = prompt_tokens
    return {"type": "prefix-based-pd-decider", "parameters": params}


# -- deciders ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "cached_blocks", "non_cached", "min_prompt", "expected"),
    [
        pytest.param(100, 0, 0, 0, False, id="threshold-0-is-off"),
        pytest.param(100, 0, 50, 0, True, id="uncached-above-threshold"),
        pytest.param(100, 0, 100, 0, True, id="uncached-equal-threshold"),
        pytest.param(100, 0, 101, 0, False, id="uncached-below-threshold"),
        pytest.param(100, 4, 50, 0, False, id="mostly-cached-on-decode"),  # 4 blocks × 16 = 64 cached, 36 left
        pytest.param(100, 3, 50, 0, True, id="partly-cached-on-decode"),  # 48 cached, 52 left
        pytest.param(100, 0, 50, 200, False, id="prompt-below-minimum"),
        pytest.param(300, 0, 50, 200, True, id="prompt-above-minimum"),
    ],
)
def test_prefix_based_decider_table(prompt, cached_blocks, non_cached, min_prompt, expected) -> None:
    snap = table_with([{}, {}]).snapshot()
    st_ = state(snap)
    publish(st_, TOKEN_PRODUCER, TokenizedPrompt(prompt, b"x" * 4 * prompt, exact=True))
    matched = np.array([float(cached_blocks), 0.0])
    publish(st_, "approx-prefix-cache-producer", PrefixMatch(matched, 10, 16))
    assert PrefixBasedDecider("d", non_cached, min_prompt).disaggregate(st_, 0) is expected


def test_prefix_based_decider_without_a_prefix_match_does_not_disaggregate() -> None:
    snap = table_with([{}]).snapshot()
    st_ = state(snap, request("x" * 4000))
    assert PrefixBasedDecider("d", 1).disaggregate(st_, 0) is False  # as upstream: no match info, no P/D


def test_always_decider_approves_everything() -> None:
    snap = table_with([{}]).snapshot()
    assert AlwaysDisaggDecider().disaggregate(state(snap), 0) is True


# -- the handler -------------------------------------------------------------------------------------------------

ROLES_2P2D = [{ROLE: "prefill"}, {ROLE: "prefill"}, {ROLE: "decode"}, {ROLE: "decode"}]


def _pick(config: Any, labels: list[dict[str, str]], prompt: str = "hello", rows: Any = None) -> StagedPick:
    scheduler = build_scheduler(config, seed=0)
    assert isinstance(scheduler.handler, DisaggScheduler)
    snap = table_with(rows or [{}] * len(labels), labels=labels).snapshot()
    result = scheduler.handler.pick(snap, snap.slots, request(prompt), NOW)
    assert isinstance(result, StagedPick)
    return result


@pytest.mark.parametrize(
    ("decider", "labels", "prompt", "decode_in", "prefill_in"),
    [
        pytest.param(ALWAYS, ROLES_2P2D, "hi", {2, 3}, {0, 1}, id="always: prefill on a prefill pod"),
        pytest.param(prefix_decider(0), ROLES_2P2D, "x" * 4000, {2, 3}, set(), id="threshold-0: decode only"),
        pytest.param(prefix_decider(100), ROLES_2P2D, "x" * 4000, {2, 3}, {0, 1}, id="long uncached: P/D"),
        pytest.param(prefix_decider(100), ROLES_2P2D, "x" * 40, {2, 3}, set(), id="short: decode only"),
        pytest.param(ALWAYS, [{ROLE: "decode"}] * 2, "hi", {0, 1}, set(), id="no prefill pod: decode only"),
        pytest.param(ALWAYS, [{ROLE: "both"}] * 2, "hi", {0, 1}, {0, 1}, id="both roles: the other pod prefills"),
    ],
)
def test_disagg_handler_table(decider, labels, prompt, decode_in, prefill_in) -> None:
    result = _pick(pd_config(decider), labels, prompt)
    assert int(result[0]) in decode_in
    if prefill_in:
        assert result.prefill in prefill_in and result.prefill != int(result[0])
    else:
        assert result.prefill == -1


def test_no_decode_endpoint_means_no_pick_at_all() -> None:
    assert _pick(pd_config(ALWAYS), [{ROLE: "prefill"}] * 2) == ()


def test_a_handler_without_a_prefill_decider_runs_decode_only_and_warns_once() -> None:
    """Upstream: "No deciders.prefill configured, P/D disaggregation disabled": the config loads, decode only."""
    doc = pd_config(None, {"type": "disagg-profile-handler"})
    scheduler = build_scheduler(doc, seed=0)
    assert isinstance(scheduler.handler, DisaggScheduler) and scheduler.handler.prefill is None
    (warning,) = [w for w in deprecations(doc) if "disagg-profile-handler" in w]
    assert "profile(s) prefill never run" in warning and "disaggregation is disabled" in warning
    snap = table_with([{}] * 4, labels=ROLES_2P2D).snapshot()
    pick = scheduler.handler.pick(snap, snap.slots, request("the same long document " * 100), NOW)
    assert isinstance(pick, StagedPick) and pick.prefill == -1


def test_cached_prompts_decode_directly_after_the_first_pd() -> None:
    """The second identical long prompt finds its prefix on the decode pod the first one went to."""
    scheduler = build_scheduler(pd_config(prefix_decider(200)), seed=0)
    snap = table_with([{}] * 4, labels=ROLES_2P2D).snapshot()
    prompt = "the same long document " * 100
    first = scheduler.handler.pick(snap, snap.slots, request(prompt), NOW)
    second = scheduler.handler.pick(snap, snap.slots, request(prompt), NOW)
    assert isinstance(first, StagedPick) and isinstance(second, StagedPick)
    assert first.prefill in (0, 1) and second.prefill == -1 and int(second[0]) == int(first[0])


@pytest.mark.parametrize(
    ("handler", "words"),
    [
        ({"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "nope"}}}, "is not defined"),
        ({"type": "disagg-profile-handler", "parameters": {"deciders": {"prefill": "queue-scorer"}}}, "is a scorer"),
        (
            {
                "type": "disagg-profile-handler",
                "parameters": {"profiles": {"decode": "d"}, "deciders": {"prefill": "decider"}},
            },
            "decode profile 'd' is not in schedulingProfiles",
        ),
        ({"type": "disagg-profile-handler", "parameters": {"deciders": {"prefil": "decider"}}}, "prefil"),
    ],
)
def test_handler_misconfigurations_are_refused_naming_the_field(handler, words) -> None:
    with pytest.raises(ConfigError, match=words):
        build_scheduler(pd_config(ALWAYS, handler))


def test_pd_profile_handler_maps_to_disagg_with_its_older_parameters() -> None:
    handler = {"type": "pd-profile-handler", "parameters": {"deciderPluginName": "decider", "prefixPluginName": "x"}}
    config = pd_config(ALWAYS, handler)
    result = _pick(config, ROLES_2P2D)
    assert result.prefill in (0, 1)
    assert any("'pd-profile-handler' is deprecated, use 'disagg-profile-handler'" in w for w in deprecations(config))


def test_data_parallel_handler_sends_to_the_primary_port_and_names_the_rank() -> None:
    doc = {
        **BASE,
        "plugins": [{"type": "queue-scorer"}, {"type": "data-parallel-profile-handler"}],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]}],
    }
    table = table_with([{}, {}])
    director = Director(table, build_scheduler(parse_config(doc, "dp.yaml")), clock=lambda: NOW)
    decision = director.decide(request("hi"))
    rank = address(decision.slot)
    assert decision.addresses[0] == rank.rsplit(":", 1)[0] + ":8000"
    assert dict(decision.headers) == {DATA_PARALLEL_HEADER: rank}
    director.complete(decision)
    assert table.snapshot().inflight[decision.slot] == 0


# -- the answer --------------------------------------------------------------------------------------------------


def test_director_answers_decode_with_the_prefiller_header_and_books_both_until_complete() -> None:
    table = table_with([{}] * 4, labels=ROLES_2P2D)
    director = Director(table, build_scheduler(pd_config(ALWAYS), seed=0), clock=lambda: NOW)
    decision = director.decide(request("hi"))
    snap = table.snapshot()
    ((prefill_slot, prefill_address),) = decision.stages
    assert decision.slot in (2, 3) and prefill_slot in (0, 1)
    assert decision.addresses == (address(decision.slot),)
    assert dict(decision.headers) == {PREFILLER_HEADER: prefill_address}
    assert snap.inflight[decision.slot] == 1 and snap.inflight[prefill_slot] == 1
    director.complete(decision)
    snap = table.snapshot()
    assert snap.inflight[decision.slot] == 0 and snap.inflight[prefill_slot] == 0


def test_decode_only_decisions_carry_no_stage_header() -> None:
    table = table_with([{}] * 4, labels=ROLES_2P2D)
    director = Director(table, build_scheduler(pd_config(prefix_decider(0)), seed=0), clock=lambda: NOW)
    decision = director.decide(request("hi"))
    assert decision.headers == () and decision.stages == ()


def test_the_prefill_endpoint_is_credited_with_the_prompt() -> None:
    """After a P/D pick, the prefix index holds the prompt on the prefill endpoint too."""
    scheduler = build_scheduler(pd_config(ALWAYS), seed=0)
    assert isinstance(scheduler.handler, DisaggScheduler) and scheduler.handler.prefill is not None
    snap = table_with([{}] * 4, labels=ROLES_2P2D).snapshot()
    prompt = "a shared system prompt " * 40
    first = scheduler.handler.pick(snap, snap.slots, request(prompt), NOW)
    assert isinstance(first, StagedPick)
    _, st_ = scheduler.handler.prefill.profile.run(snap, snap.slots, request(prompt), NOW)
    match = produced(st_, "approx-prefix-cache-producer")
    assert match is not None and match.matched[first.prefill] > 0


# -- property ----------------------------------------------------------------------------------------------------

ROLES = ["prefill", "decode", "both", "prefill-decode", None]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    roles=st.lists(st.sampled_from(ROLES), min_size=1, max_size=6),
    subset_pick=st.one_of(st.none(), st.lists(st.integers(0, 5), min_size=1, max_size=4)),
    waiting=st.lists(st.floats(0, 20), min_size=6, max_size=6),
    local_tier=st.sampled_from(["eu", "us"]),
    allowed=st.one_of(st.none(), st.lists(st.sampled_from(["eu", "us"]), max_size=2, unique=True)),
    prompt_len=st.integers(0, 3000),
    decider=st.sampled_from([ALWAYS, prefix_decider(100), prefix_decider(0)]),
)
def test_stages_stay_in_their_roles_the_subset_and_the_allowed_tiers(
    roles, subset_pick, waiting, local_tier, allowed, prompt_len, decider
) -> None:
    labels = [{ROLE: r} if r else {} for r in roles]
    table = table_with([{"waiting": waiting[i]} for i in range(len(roles))], labels=labels)
    table.synced = True
    federation = None if allowed is None else {"residency": {"defaultTiers": allowed}}
    fed = router(registry(), local_tier, federation) if federation else None
    director = Director(table, build_scheduler(pd_config(decider), seed=0), clock=lambda: NOW, federation=fed)
    addresses = [address(i) for i in range(len(roles))]
    subset = None if subset_pick is None else [addresses[i % len(addresses)] for i in subset_pick]
    try:
        decision = director.decide(request("y" * prompt_len), subset)
    except EppError:
        return  # no decode-capable candidate, or residency forbids the local pool: refused, never misrouted
    decode_ok = {i for i, r in enumerate(roles) if r in ("decode", "both", "prefill-decode", None)}
    prefill_ok = {i for i, r in enumerate(roles) if r in ("prefill", "both", "prefill-decode")}
    within = set(range(len(roles))) if subset is None else {addresses.index(a) for a in subset}
    assert decision.slot in decode_ok & within
    for slot, _ in decision.stages:
        assert slot in prefill_ok & within and slot != decision.slot
    if allowed is not None:
        assert local_tier in allowed  # a local pick of either stage is only made where the tier is allowed
    director.complete(decision)
    assert int(table.snapshot().inflight.sum()) == 0


def test_pool_saturation_is_the_most_saturated_stage() -> None:
    """Flow control and shedding read this: a saturated prefill fleet holds requests back while decode is idle."""
    scheduler = build_scheduler(pd_config(ALWAYS), seed=0)
    rows = [{"waiting": 50.0}, {"waiting": 50.0}, {"waiting": 0.0}, {"waiting": 0.0}]
    table = table_with(rows, labels=ROLES_2P2D)
    snap = table.snapshot()
    assert scheduler.saturation.saturation(snap, snap.slots, NOW) >= 1.0
    assert scheduler.saturation.saturation(snap, np.array([2, 3]), NOW) < 1.0  # decode alone has room
    assert scheduler.saturation.thresholds.queue_depth == 5  # the wrapped detector's settings read through


def test_a_prefill_endpoint_with_unusable_data_is_not_named() -> None:
    """A prefill server that stopped answering its scrapes: the decode endpoint prefills instead."""
    rows: list[dict[str, object]] = [{"scraped": False}, {"scraped": False}, {}, {}]
    result = _pick(pd_config(ALWAYS), ROLES_2P2D, rows=rows)
    assert int(result[0]) in (2, 3) and result.prefill == -1


@pytest.mark.parametrize(
    "parameters",
    [
        {"prefillDeciderPluginName": "decider"},
        {"deciderPluginName": "decider", "decodeProfile": "decode", "prefillProfile": "prefill"},
        {"stageOrder": "decode-first", "deciders": {"prefill": "decider"}},
    ],
)
def test_the_handler_takes_upstreams_flat_parameters_and_its_stage_order(parameters) -> None:
    """disagg_profile_handler.go: the deprecated flat format still loads (one warning), and stageOrder decode-first."""
    doc = pd_config(ALWAYS, {"type": "disagg-profile-handler", "parameters": parameters})
    scheduler = build_scheduler(doc, seed=0)
    assert isinstance(scheduler.handler, DisaggScheduler) and scheduler.handler.prefill is not None
    flat = [w for w in deprecations(doc) if "deprecated parameter" in w]
    assert len(flat) == (0 if "deciders" in parameters else 1)


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"prefillDeciderPluginName": "decider", "deciders": {"prefill": "decider"}}, "use one format"),
        ({"stageOrder": "prefill-first"}, "prefill-first is not implemented here"),
        ({"stageOrder": "sideways"}, "invalid stage order"),
    ],
)
def test_the_handler_refuses_mixed_formats_and_an_unknown_stage_order(parameters, words) -> None:
    with pytest.raises(ConfigError, match=words):
        build_scheduler(pd_config(ALWAYS, {"type": "disagg-profile-handler", "parameters": parameters}))
