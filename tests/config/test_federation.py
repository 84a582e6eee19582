"""The `federation:` section parser: the full schema, defaults, and a ConfigError naming the field for each mistake."""

from typing import Any

import pytest
import yaml

from epp.config.federation import parse_address, parse_federation
from epp.errors import ConfigError

FULL = """
staleSites: lastResort
heartbeat: {deliveredCadenceSeconds: 10, maxFutureSkewSeconds: 2}
sites: {dc-1: "127.0.0.1:8081", dc-6: "[::1]:8082"}
overflow: {weights: {freeGpus: 2, inflight: 3}}
residency:
  defaultTiers: [eu-west]
  rules:
    - name: patient-data
      models: [llama-med]
      modelPrefixes: ["eu/"]
      objectives: [critical]
      tiers: [eu-west, eu-central]
"""


def test_full_section_is_parsed() -> None:
    cfg = parse_federation(yaml.safe_load(FULL), "epp.yaml")
    assert cfg.stale_last_resort
    assert cfg.phase_rule.delivered_cadence_s == 10.0
    assert cfg.phase_rule.max_future_skew_s == 2.0
    assert dict(cfg.site_addresses) == {"dc-1": "127.0.0.1:8081", "dc-6": "[::1]:8082"}
    assert cfg.weights.free_gpus == 2.0 and cfg.weights.inflight == 3.0 and cfg.weights.ready_services == 1.0
    assert cfg.default_tiers == frozenset({"eu-west"})
    (rule,) = cfg.rules
    assert rule.name == "patient-data"
    assert rule.tiers == frozenset({"eu-west", "eu-central"})
    assert rule.matches("llama-med", "critical") and rule.matches("eu/x", "critical")
    assert not rule.matches("llama-med", None) and not rule.matches("llama", "critical")


@pytest.mark.parametrize("raw", [None, {}], ids=["absent", "empty"])
def test_absent_section_means_no_rules_and_defaults(raw: Any) -> None:
    cfg = parse_federation(raw)
    assert cfg.rules == () and cfg.default_tiers is None and not cfg.stale_last_resort
    assert cfg.phase_rule.delivered_cadence_s == 30.0


def _rule(**overrides: Any) -> dict[str, Any]:
    rule: dict[str, Any] = {"name": "r", "models": ["m"], "tiers": ["eu"]}
    rule.update(overrides)
    return {k: v for k, v in rule.items() if v is not None}


BAD = [
    ([], "federation: must be a map", "not-a-map"),
    ({"tier": "eu"}, "federation.tier: unknown field", "unknown-top-field"),
    ({"staleSites": "sometimes"}, "federation.staleSites: must be exclude or lastResort", "stale-sites-value"),
    ({"heartbeat": {"deliveredCadenceSeconds": -1}}, "deliveredCadenceSeconds: must be ≥ 0", "negative-cadence"),
    ({"heartbeat": {"maxFutureSkewSeconds": "10s"}}, "maxFutureSkewSeconds: must be a number", "skew-not-number"),
    ({"sites": ["dc-1"]}, "federation.sites: must map", "sites-not-map"),
    ({"sites": {"dc-1": "gw.example.com:80"}}, "federation.sites.dc-1: host must be an IP", "site-hostname"),
    ({"sites": {"dc-1": "127.0.0.1"}}, "federation.sites.dc-1: must be ip:port", "site-no-port"),
    ({"sites": {"dc-1": "127.0.0.1:99999"}}, "federation.sites.dc-1: port must be", "site-bad-port"),
    ({"overflow": {"weights": {"gpus": 1}}}, "federation.overflow.weights.gpus: unknown field", "unknown-weight"),
    ({"overflow": {"weights": {"inflight": True}}}, "weights.inflight: must be a number", "bool-number"),
    ({"saturation": {}}, "federation.saturation: unknown field", "saturation-is-the-scheduler's"),
    ({"residency": {"rules": {}}}, "federation.residency.rules: must be a list", "rules-not-list"),
    ({"residency": {"defaultTiers": "eu"}}, "federation.residency.defaultTiers: must be a list", "default-not-list"),
    ({"residency": {"rules": [_rule(name=None)]}}, "rules[0].name: is missing", "rule-without-name"),
    ({"residency": {"rules": [_rule(), _rule()]}}, "rules[1].name: 'r' is used by an earlier rule", "duplicate"),
    ({"residency": {"rules": [_rule(models=None)]}}, "rules[0]: must name models or modelPrefixes", "no-match"),
    ({"residency": {"rules": [_rule(tiers=None)]}}, "rules[0].tiers: is missing", "no-tiers"),
    ({"residency": {"rules": [_rule(tiers="eu")]}}, "rules[0].tiers: must be a list", "tiers-string"),
    ({"residency": {"rules": [_rule(objectives=[])]}}, "rules[0].objectives: must list at least one", "objectives"),
    ({"residency": {"rules": [_rule(model="m")]}}, "rules[0].model: unknown field", "rule-typo"),
]


@pytest.mark.parametrize(("raw", "message"), [b[:2] for b in BAD], ids=[b[2] for b in BAD])
def test_mistakes_name_the_file_and_field(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_federation(raw, "epp.yaml")
    assert str(exc.value).startswith("epp.yaml: ")
    assert message in str(exc.value)


def test_a_rule_with_no_tiers_blocks_its_model_everywhere() -> None:
    cfg = parse_federation({"residency": {"rules": [_rule(tiers=[])]}})
    assert cfg.rules[0].tiers == frozenset()


@pytest.mark.parametrize(
    ("text", "canonical"),
    [("127.0.0.1:80", "127.0.0.1:80"), (" 127.10.0.7:08081 ", "127.10.0.7:8081"), ("[::1]:9000", "[::1]:9000")],
    ids=["v4", "padded", "v6"],
)
def test_addresses_are_canonical_ip_port(text: str, canonical: str) -> None:
    assert parse_address(text) == canonical
