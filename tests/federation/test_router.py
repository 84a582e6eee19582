"""The federation step through the director: local first, overflow to the best eligible site, residency fail-closed."""

import pytest

from epp.config.federation import parse_federation
from epp.datastore.pool import FailureMode
from epp.director import Decision
from epp.errors import ConfigError, EppError, ErrorCode
from epp.federation.policy import check_fail_open
from epp.scheduling import Scheduler
from tests.federation.builders import NOW, director, local_table, registry, request, router, site

EU_ONLY = {"residency": {"rules": [{"name": "eu-data", "modelPrefixes": ["eu/"], "tiers": ["eu"]}]}}


def _decide(d, req, subset=None) -> Decision:  # type: ignore[no-untyped-def]
    return d.decide(req, subset)


def test_unsaturated_local_endpoints_keep_the_traffic() -> None:
    sites = registry(site("dc", "dc", 1))
    decision = _decide(director(local_table(2), router(sites)), request())
    assert decision.site is None
    assert decision.addresses[0].startswith("127.10.0.")


def test_saturated_local_pool_overflows_to_the_connected_site_and_books_it() -> None:
    sites = registry(site("dc", "dc", 1))
    d = director(local_table(2, waiting=50), router(sites))
    decision = _decide(d, request())
    assert (decision.site, decision.addresses, decision.slot) == ("dc", ("127.20.0.1:8080",), -1)
    assert sites.inflight("dc") == 1
    d.complete(decision)
    assert sites.inflight("dc") == 0


def test_restricted_traffic_stays_on_saturated_local_endpoints() -> None:
    sites = registry(site("dc", "dc", 1))
    decision = _decide(director(local_table(2, waiting=50), router(sites, "eu", EU_ONLY)), request("eu/llama"))
    assert decision.site is None


def test_restricted_traffic_overflows_only_within_its_tier() -> None:
    sites = registry(site("dc", "dc", 1, gpus_allocatable=64), site("eu-2", "eu", 2, gpus_allocatable=1))
    decision = _decide(director(local_table(1, waiting=50), router(sites, "eu", EU_ONLY)), request("eu/llama"))
    assert decision.site == "eu-2"
    assert decision.addresses == ("127.20.0.2:8080",)


def test_no_allowed_candidate_is_503_naming_the_rule_even_under_fail_open() -> None:
    sites = registry(site("dc", "dc", 1))
    d = director(local_table(2), router(sites, "us", EU_ONLY), mode=FailureMode.FAIL_OPEN)
    with pytest.raises(EppError) as exc:
        _decide(d, request("eu/llama"))
    assert exc.value.code is ErrorCode.SERVICE_UNAVAILABLE
    assert "residency rule 'eu-data' allow tiers [eu]" in exc.value.message
    assert "local tier 'us' not allowed" in exc.value.message


def test_unknown_local_tier_is_not_allowed_for_restricted_traffic() -> None:
    with pytest.raises(EppError) as exc:
        _decide(director(local_table(2), router(registry(), "", EU_ONLY)), request("eu/llama"))
    assert "local tier unknown (--tier)" in exc.value.message


def test_header_narrows_but_never_widens() -> None:
    sites = registry(site("dc", "dc", 1), site("eu-2", "eu", 2))
    fed = router(sites, "eu", EU_ONLY)
    with pytest.raises(EppError) as exc:  # restricted to eu; the header asks for dc only: nothing left
        _decide(director(local_table(1), fed), request("eu/llama", x_epp_allowed_tiers="dc"))
    assert "header x-epp-allowed-tiers allow tiers [none]" in exc.value.message
    # unrestricted model, header narrows to eu: the saturated local eu endpoint would do, but eu-2 takes overflow
    decision = _decide(director(local_table(1, waiting=50), fed), request("llama", x_epp_allowed_tiers="eu, nowhere"))
    assert decision.site == "eu-2"


@pytest.mark.parametrize(
    ("age", "last_resort", "overflows"),
    [(90.0, False, True), (100.0, False, False), (100.0, True, True), (300.5, True, False)],
    ids=["connected", "stale-excluded", "stale-last-resort", "unreachable-never"],
)
def test_stale_sites_only_as_configured_last_resort(age: float, last_resort: bool, overflows: bool) -> None:
    fed = router(
        registry(site("s", "dc", 1, age=age)), federation={"staleSites": "lastResort" if last_resort else "exclude"}
    )
    decision = _decide(director(local_table(1, waiting=50), fed), request())
    assert decision.site == ("s" if overflows else None)  # else it stays on the saturated local endpoint


def test_a_connected_site_beats_a_bigger_stale_one() -> None:
    sites = registry(site("stale", "dc", 1, age=100.0, gpus_allocatable=64), site("connected", "dc", 2))
    fed = router(sites, federation={"staleSites": "lastResort"})
    assert _decide(director(local_table(0), fed), request()).site == "connected"


@pytest.mark.parametrize(
    "broken",
    [
        {"address": None, "address_problem": "no annotation"},
        {"services_ready": 0},
        {"services_ready": None},
        {"age": None},
        {"age": -3600.0},
        {"tier": ""},
    ],
    ids=["no-address", "no-ready-service", "no-inference-status", "no-heartbeat", "future-heartbeat", "no-tier"],
)
def test_ineligible_sites_never_take_restricted_traffic(broken: dict) -> None:  # type: ignore[type-arg]
    fields = {"tier": "eu", **broken}
    sites = registry(site("x", n=1, **fields))
    with pytest.raises(EppError):
        _decide(director(local_table(0), router(sites, "us", EU_ONLY)), request("eu/a"))


def test_empty_local_pool_still_overflows() -> None:
    decision = _decide(director(local_table(0), router(registry(site("dc", "dc", 1)))), request())
    assert decision.site == "dc"


def test_overflow_ranks_by_capacity_and_spreads_by_inflight() -> None:
    sites = registry(site("big", "dc", 1, gpus_allocatable=8), site("small", "dc", 2, gpus_allocatable=2))
    d = director(local_table(1, waiting=50), router(sites))
    picks = [_decide(d, request()).site for _ in range(6)]
    assert picks[0] == "big"
    assert "small" in picks  # in-flight load moves later requests
    assert picks.count("big") > picks.count("small")
    assert sites.inflight("big") + sites.inflight("small") == 6


def test_failed_services_count_against_a_site() -> None:
    sites = registry(site("healthy", "dc", 1), site("failing", "dc", 2, services_total=4, services_failed=2))
    decision = _decide(director(local_table(0), router(sites)), request())
    assert decision.site == "healthy"
    assert decision.addresses == ("127.20.0.1:8080",)  # one address: ORIGINAL_DST cannot parse a fallback list


def test_subset_hint_narrows_sites_too() -> None:
    sites = registry(site("a", "dc", 1), site("b", "dc", 2, gpus_allocatable=1))
    decision = _decide(director(local_table(0), router(sites)), request(), subset=["127.20.0.2:8080"])
    assert decision.site == "b"


def test_objective_rule_applies_only_to_its_objective_and_rules_intersect() -> None:
    fed = {
        "residency": {
            "rules": [
                {"name": "eu-data", "modelPrefixes": ["eu/"], "tiers": ["eu", "eu-2"]},
                {"name": "critical", "modelPrefixes": ["eu/"], "objectives": ["critical"], "tiers": ["eu-2"]},
            ]
        }
    }
    sites = registry(site("e1", "eu", 1, gpus_allocatable=64), site("e2", "eu-2", 2))
    d = director(local_table(0), router(sites, "us", fed))
    assert _decide(d, request("eu/m")).site == "e1"
    assert _decide(d, request("eu/m", objective="critical")).site == "e2"


def test_debug_view_shows_every_site_with_its_recomputed_phase() -> None:
    sites = registry(site("ok", "dc", 1, reported_phase="Unreachable"), site("gone", "dc", 2, age=None, address=None))
    view = {s["name"]: s for s in router(sites).debug_view(NOW)}
    assert view["ok"]["phase"] == "Connected" and view["ok"]["reportedPhase"] == "Unreachable"
    assert view["ok"]["routable"]
    assert view["gone"]["phase"] == "Unreachable" and not view["gone"]["routable"]
    assert "no gateway address" in view["gone"]["notRoutableBecause"]


@pytest.mark.parametrize(
    ("tier", "mode", "allow", "outcome"),
    [
        ("us", "FailOpen", False, "refused"),
        ("us", "FailOpen", True, "warned"),
        ("us", "FailClose", False, "fine"),
        ("eu", "FailOpen", False, "fine"),
        ("", "FailOpen", False, "refused"),
    ],
    ids=["fail-open-leak", "override", "fail-close", "local-allowed", "unknown-tier"],
)
def test_fail_open_pool_serving_a_model_local_may_not_serve(tier: str, mode: str, allow: bool, outcome: str) -> None:
    cfg = parse_federation(EU_ONLY)
    if outcome == "refused":
        with pytest.raises(ConfigError, match=r"epp.yaml: the pool's failureMode is FailOpen .* eu-data"):
            check_fail_open(cfg, tier, FailureMode(mode), allow, "epp.yaml")
        return
    warning = check_fail_open(cfg, tier, FailureMode(mode), allow, "epp.yaml")
    assert bool(warning) is (outcome == "warned")


def test_a_remote_pick_marks_the_request_so_the_next_site_never_forwards_it_again() -> None:
    sites = registry(site("dc", "dc", 1))
    d = director(local_table(1, waiting=50), router(sites, "eu"))
    decision = _decide(d, request())
    assert decision.site == "dc" and decision.headers == (("x-epp-federated-from", "eu"),)
    # The same request arriving with the marker (at the next site's picker) stays on its local endpoints.
    again = _decide(d, request(x_epp_federated_from="eu"))
    assert again.site is None and again.headers == ()


def test_a_forwarded_request_with_no_local_candidate_is_503_saying_why() -> None:
    d = director(local_table(0), router(registry(site("dc", "dc", 1))))
    with pytest.raises(EppError) as exc:
        _decide(d, request(x_epp_federated_from="eu"))
    assert "not forwarded again" in exc.value.message


@pytest.mark.parametrize(
    ("asked", "rewritten_to"),
    [("chat", "eu/med"), ("eu/med", "chat")],
    ids=["rewritten-onto-a-restricted-model", "restricted-model-renamed"],
)
def test_a_rewrite_never_escapes_a_rule(asked: str, rewritten_to: str) -> None:
    from epp.datastore.objectives import ObjectiveStore, RewriteRule, RewriteTarget
    from epp.director import Director
    from tests.support.schedulers import RandomScheduler

    store = ObjectiveStore()
    store.put_rewrite("default/r", (RewriteRule(asked, (RewriteTarget(rewritten_to),)),))
    fed = router(registry(site("dc", "dc", 1)), "us", EU_ONLY)
    d = Director(
        local_table(1), Scheduler(RandomScheduler(seed=1)), clock=lambda: NOW, objectives=store, federation=fed
    )
    req = request(asked)._replace(body={"model": asked, "prompt": "hi"})
    with pytest.raises(EppError) as exc:  # local tier us and the only site in dc: eu-only traffic has nowhere to go
        d.decide(req)
    assert "residency rule 'eu-data'" in exc.value.message
    assert d.decide(request("free")).site is None  # an unrelated model is unaffected
