"""Property: whatever the sites, tiers, phases, rules, subset hints, failure modes and local saturation, no pick
ever lands outside the request's allowed tiers, and "no candidate" always yields a 503."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.datastore.pool import FailureMode
from epp.errors import EppError, ErrorCode
from epp.federation.phase import Phase, PhaseRule
from tests.federation.builders import NOW, director, local_table, registry, request, router, site

TIERS = ["eu", "us", "edge", ""]
MODELS = ["eu/a", "eu/b", "us/a", "free"]


class _FlakyScheduler:
    """Raises for every pick: exercises the director's FailOpen/FailClose fallback path."""

    def pick(self, snapshot: Any, candidates: Any, request: Any, now: float) -> list[int]:
        raise RuntimeError("scheduler bug")


rules = st.lists(
    st.fixed_dictionaries(
        {
            "prefix": st.sampled_from(["eu/", "us/", "eu/a", "f"]),
            "tiers": st.lists(st.sampled_from(TIERS[:3]), max_size=3, unique=True),
            "objective": st.sampled_from([None, "critical"]),
        }
    ),
    max_size=3,
)
sites = st.lists(
    st.fixed_dictionaries(
        {
            "tier": st.sampled_from(TIERS),
            "age": st.one_of(st.none(), st.sampled_from([-60.0, -5.0, 0.0, 90.0, 90.5, 300.0, 301.0, 5000.0])),
            "has_address": st.booleans(),
            "ready": st.sampled_from([None, 0, 1, 3]),
            "gpus": st.integers(0, 8),
        }
    ),
    max_size=4,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    site_specs=sites,
    rule_specs=rules,
    default_tiers=st.one_of(st.none(), st.lists(st.sampled_from(TIERS[:3]), max_size=2, unique=True)),
    local_tier=st.sampled_from(TIERS),
    local_n=st.integers(0, 3),
    saturated=st.booleans(),
    stale_last_resort=st.booleans(),
    mode=st.sampled_from(list(FailureMode)),
    flaky=st.booleans(),
    model=st.sampled_from(MODELS),
    objective=st.sampled_from([None, "critical"]),
    header=st.one_of(st.none(), st.lists(st.sampled_from([*TIERS[:3], "mars"]), max_size=3)),
    subset_pick=st.one_of(st.none(), st.lists(st.integers(0, 7), max_size=6)),
    repeats=st.integers(1, 3),
    hop=st.booleans(),
)
def test_no_pick_outside_allowed_tiers_and_no_candidate_is_503(
    site_specs: list[dict[str, Any]],
    rule_specs: list[dict[str, Any]],
    default_tiers: list[str] | None,
    local_tier: str,
    local_n: int,
    saturated: bool,
    stale_last_resort: bool,
    mode: FailureMode,
    flaky: bool,
    model: str,
    objective: str | None,
    header: list[str] | None,
    subset_pick: list[int] | None,
    repeats: int,
    hop: bool,
) -> None:
    residency: dict[str, Any] = {"rules": []}
    for i, r in enumerate(rule_specs):
        rule: dict[str, Any] = {"name": f"r{i}", "modelPrefixes": [r["prefix"]], "tiers": r["tiers"]}
        if r["objective"]:
            rule["objectives"] = [r["objective"]]
        residency["rules"].append(rule)
    if default_tiers is not None:
        residency["defaultTiers"] = default_tiers
    config = {"residency": residency, "staleSites": "lastResort" if stale_last_resort else "exclude"}
    reg = registry(
        *(
            site(
                f"s{i}",
                s["tier"],
                i + 1,
                age=s["age"],
                address=f"127.20.0.{i + 1}:8080" if s["has_address"] else None,
                services_ready=s["ready"],
                gpus_allocatable=s["gpus"],
            )
            for i, s in enumerate(site_specs)
        )
    )
    table = local_table(local_n, waiting=50.0 if saturated else 0.0)
    local_addresses = set(table.addresses())
    all_addresses = sorted(local_addresses) + [f"127.20.0.{i + 1}:8080" for i in range(len(site_specs))]
    subset = (
        None if subset_pick is None else [all_addresses[i % len(all_addresses)] for i in subset_pick if all_addresses]
    )
    headers = {} if header is None else {"x-epp-allowed-tiers": ",".join(header)}
    if hop:  # the request already came from another site: it may not be forwarded again
        headers["x-epp-federated-from"] = "elsewhere"
    req = request(model, objective, **{k.replace("-", "_"): v for k, v in headers.items()})
    d = director(table, router(reg, local_tier, config), mode=mode, scheduler=_FlakyScheduler() if flaky else None)

    # The oracle, written from the words rather than from the implementation.
    allowed: set[str] | None = None
    for r in rule_specs:
        if model.startswith(r["prefix"]) and (r["objective"] is None or r["objective"] == objective):
            allowed = set(r["tiers"]) if allowed is None else allowed & set(r["tiers"])
    if allowed is None and default_tiers is not None:
        allowed = set(default_tiers)
    if header is not None:
        allowed = set(header) if allowed is None else allowed & set(header)

    def tier_ok(tier: str) -> bool:
        return allowed is None or (tier != "" and tier in allowed)

    rule = PhaseRule()
    site_ok = {}
    for i, s in enumerate(site_specs):
        address = f"127.20.0.{i + 1}:8080"
        last = None if s["age"] is None else NOW - s["age"]
        phase = rule.phase(last, 30.0, NOW)
        site_ok[address] = (
            not hop
            and s["has_address"]
            and tier_ok(s["tier"])
            and bool(s["ready"])
            and phase is not Phase.UNREACHABLE
            and (phase is Phase.CONNECTED or stale_last_resort)
            and (subset is None or address in subset)
        )
    local_ok = tier_ok(local_tier) and any(subset is None or a in subset for a in local_addresses)
    any_candidate = local_ok or any(site_ok.values())

    for _ in range(repeats):
        try:
            decision = d.decide(req, subset)
        except EppError as exc:
            assert exc.code is ErrorCode.SERVICE_UNAVAILABLE
            continue
        assert any_candidate, "a decision was made although nothing was allowed"
        for address in decision.addresses:
            if address in local_addresses:
                assert tier_ok(local_tier) and decision.site is None
            else:
                assert site_ok[address], f"{address} is not an eligible site in an allowed tier"
        if decision.site is not None:
            assert decision.slot == -1 and dict(decision.headers).get("x-epp-federated-from") == (
                local_tier or "unknown"
            )
    if not any_candidate:
        try:
            d.decide(req, subset)
        except EppError as exc:
            assert exc.code is ErrorCode.SERVICE_UNAVAILABLE
        else:
            raise AssertionError("no candidate must always be a 503")
