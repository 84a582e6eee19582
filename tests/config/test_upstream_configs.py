"""Every config llm-d-router's own tests say must load loads here, and each of its well-known configs instantiates
the plugins its wellknown_configs_test.go expects (the files: tests/data/upstream-configs, see SOURCES.md).

Upstream's harness runs with `--allow-experimental-plugins` and registers a `mock-metrics-source`; so do these tests.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from epp.app.config_file import load_config
from epp.cli import check_config
from epp.config.files import read_config_text
from epp.scheduling.build import deprecations, effective_plugins
from epp.scheduling.config_plugins import data_layer
from epp.scheduling.plugin_type import Kind
from epp.scheduling.registry import Registry, builtin_registry

CONFIGS = Path(__file__).parent.parent / "data" / "upstream-configs"

# How many configs each upstream source says must load (llm-d-router at ebab687); e2e: the e2e suite's fixtures
# that e2e-smoke does not already hold byte for byte.
EXPECTED_COUNTS = {"wellknown": 8, "e2e-smoke": 7, "e2e": 9, "deploy": 19, "perf": 4, "integration": 3}


def _text(path: Path) -> str:
    """The EndpointPickerConfig of a file: the file itself, or for upstream's perf Helm values the one config in
    `router.epp.pluginsCustomConfig`."""
    if path.parent.name != "perf":
        return path.read_text()
    values = yaml.safe_load(path.read_text())
    (config,) = values["router"]["epp"]["pluginsCustomConfig"].values()
    return str(config)


def _all_configs() -> list[Path]:
    return sorted(p for p in CONFIGS.glob("*/*.yaml"))


def _registry() -> Registry:
    """Ours plus the data source upstream's integration harness registers for its test configs."""
    registry = builtin_registry()
    registry.register("mock-metrics-source", Kind.DATA_LAYER, data_layer("mock-metrics-source"), "test only")
    return registry


def test_the_copied_configs_are_every_must_load_config_upstream_names() -> None:
    counts = {d: len(list((CONFIGS / d).glob("*.yaml"))) for d in EXPECTED_COUNTS}
    assert counts == EXPECTED_COUNTS
    assert len(_all_configs()) == 50


@pytest.mark.parametrize("path", _all_configs(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_must_load_upstream_config_loads(path: Path) -> None:
    config = load_config(None, _registry(), text=_text(path), allow_experimental=True, warn=False)
    assert config.profiles


def test_check_config_accepts_every_upstream_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(p) for p in _all_configs() if p.parent.name in ("wellknown", "e2e-smoke", "e2e", "deploy")]
    args = argparse.Namespace(files=files, allow_experimental_plugins=True)
    assert check_config.run(args) == 0
    out = capsys.readouterr().out
    assert out.count("\nok: ") + out.startswith("ok: ") == len(files) == 43
    assert "refused" not in out


# wellknown_configs_test.go's `expectedPlugins`, as (name, type) pairs.
_OPTIMIZED_BASELINE = {
    ("queue-scorer", "queue-scorer"),
    ("kv-cache-utilization-scorer", "kv-cache-utilization-scorer"),
    ("no-hit-lru-scorer", "no-hit-lru-scorer"),
    ("prefix-cache-scorer", "prefix-cache-scorer"),
    ("approx-prefix-cache-producer", "approx-prefix-cache-producer"),
    ("token-producer", "token-producer"),
}
_PD = {
    ("disagg-headers-handler", "disagg-headers-handler"),
    ("always-disagg-pd-decider", "always-disagg-pd-decider"),
    ("disagg-profile-handler", "disagg-profile-handler"),
    ("prefill-filter", "by-label"),
    ("decode-filter", "by-label"),
    ("prefix-cache-scorer", "prefix-cache-scorer"),
    ("approx-prefix-cache-producer", "approx-prefix-cache-producer"),
    ("token-producer", "token-producer"),
    ("queue-scorer", "queue-scorer"),
    ("kv-cache-utilization-scorer", "kv-cache-utilization-scorer"),
    ("active-request-scorer", "active-request-scorer"),
    ("max-score-picker", "max-score-picker"),
}
UPSTREAM_PLUGINS = {
    "optimized-baseline": _OPTIMIZED_BASELINE,
    "tiered-prefix-cache-cpu": {
        ("token-producer", "token-producer"),
        ("approx-prefix-cache-producer", "approx-prefix-cache-producer"),
        ("cpu-prefix-cache-producer", "approx-prefix-cache-producer"),
        ("queue-scorer", "queue-scorer"),
        ("kv-cache-utilization-scorer", "kv-cache-utilization-scorer"),
        ("gpu-prefix-cache-scorer", "prefix-cache-scorer"),
        ("cpu-prefix-cache-scorer", "prefix-cache-scorer"),
    },
    "pd-disaggregation": _PD,
    "wide-ep-lws": _PD,
    "wide-ep-lws-experimental-dp-aware": {
        ("token-producer", "token-producer"),
        ("prefill-header-handler", "disagg-headers-handler"),
        ("prefill-filter", "by-label"),
        ("decode-filter", "by-label"),
        ("prefix-cache-scorer", "prefix-cache-scorer"),
        ("approx-prefix-cache-producer", "approx-prefix-cache-producer"),
        ("active-request-scorer", "active-request-scorer"),
        ("queue-scorer", "queue-scorer"),
        ("pd-profile-handler", "pd-profile-handler"),
    },
    "flow-control": {
        ("queue-scorer", "queue-scorer"),
        ("kv-cache-utilization-scorer", "kv-cache-utilization-scorer"),
        ("prefix-cache-scorer", "prefix-cache-scorer"),
        ("approx-prefix-cache-producer", "approx-prefix-cache-producer"),
        ("token-producer", "token-producer"),
        ("round-robin-fairness-policy", "round-robin-fairness-policy"),
        ("fcfs-ordering-policy", "fcfs-ordering-policy"),
        ("concurrency-detector", "concurrency-detector"),
    },
    "predicted-latency-slo": {
        ("queue-scorer", "queue-scorer"),
        ("kv-cache-utilization-scorer", "kv-cache-utilization-scorer"),
        ("prefix-cache-scorer", "prefix-cache-scorer"),
        ("approx-prefix-cache-producer", "approx-prefix-cache-producer"),
        ("token-producer", "token-producer"),
        ("metrics-data-source", "metrics-data-source"),
        ("core-metrics-extractor", "core-metrics-extractor"),
        ("predicted-latency-producer", "predicted-latency-producer"),
        ("strict-affinity-filter", "prefix-cache-affinity-filter"),
        ("loose-affinity-filter", "prefix-cache-affinity-filter"),
        ("latency-scorer", "latency-scorer"),
        ("weighted-random-picker", "weighted-random-picker"),
        ("slo-headroom-tier-filter", "slo-headroom-tier-filter"),
        ("latency-slo-admitter", "latency-slo-admitter"),
    },
    "payload-agnostic": {
        ("passthrough-parser", "passthrough-parser"),
        ("active-request-scorer", "active-request-scorer"),
        ("session-affinity-scorer", "session-affinity-scorer"),
    },
}
# Upstream's test checks that each expected plugin exists, so its lists may leave one out; this one is in the file.
UPSTREAM_LEAVES_OUT = {"wide-ep-lws-experimental-dp-aware": {("prefix-based-pd-decider", "prefix-based-pd-decider")}}
# What upstream's loader also adds when a file names none, and its lists never name: not compared.
FRAMEWORK_DEFAULTS = frozenset(
    {
        "single-profile-handler",
        "max-score-picker",
        "utilization-detector",
        "metrics-data-source",
        "core-metrics-extractor",
        "openai-parser",
        "anthropic-parser",
        "vllmhttp-parser",
        "passthrough-parser",
    }
)


def test_every_well_known_config_has_upstreams_list() -> None:
    assert {p.stem for p in (CONFIGS / "wellknown").glob("*.yaml")} == set(UPSTREAM_PLUGINS)


@pytest.mark.parametrize("name", sorted(UPSTREAM_PLUGINS))
def test_well_known_config_instantiates_exactly_upstreams_plugins(name: str) -> None:
    config = read_config_text((CONFIGS / "wellknown" / f"{name}.yaml").read_text(), source=name)
    plugins = effective_plugins(config, allow_experimental=True)
    ours = {(p.name, p.type_name) for p in plugins if not (p.implicit and p.type_name in FRAMEWORK_DEFAULTS)}
    assert ours == UPSTREAM_PLUGINS[name] | UPSTREAM_LEAVES_OUT.get(name, set())


def test_check_config_prints_a_line_for_each_producer_a_tiered_config_builds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = CONFIGS / "wellknown" / "tiered-prefix-cache-cpu.yaml"
    assert check_config.run(argparse.Namespace(files=[str(path)], allow_experimental_plugins=True)) == 0
    out = capsys.readouterr().out
    assert "plugin cpu-prefix-cache-producer (approx-prefix-cache-producer, data producer):" in out
    assert "plugin approx-prefix-cache-producer (approx-prefix-cache-producer, data producer) (added):" in out
    assert "plugin token-producer (token-producer, data producer):" in out


# Each stand-in plugin of a config (a type that loads but cannot do its job here) is named by exactly one warning.
STAND_INS = {
    "e2e-smoke/gpuUtilConfig": ("dcgm-source", "dcgm-extractor", "gpu-utilization-filter", "gpu-utilization-scorer"),
    "e2e-smoke/pdTopologyConfig": ("topology-extractor", "topology-affinity-filter", "topology-affinity-scorer"),
    "e2e-smoke/epdConfig": ("always-disagg-multimodal-decider",),
    "deploy/epp-mm-embeddings-cache-config": ("mm-embeddings-cache-producer", "mm-embeddings-cache-scorer"),
    "deploy/sim-epp-kvcache-config": ("precise-prefix-cache-producer",),
    "deploy/sim-epp-no-hit-lru": ("precise-prefix-cache-producer",),
    "integration/request-attribute-reporter-config": ("total-tokens-cost-reporter",),
}


@pytest.mark.parametrize(("name", "plugins"), STAND_INS.items(), ids=list(STAND_INS))
def test_each_plugin_that_cannot_do_its_job_here_gets_one_warning_naming_it(
    name: str, plugins: tuple[str, ...]
) -> None:
    config = read_config_text(_text(CONFIGS / f"{name}.yaml"), source=name)
    warnings = [w for w in deprecations(config, _registry()) if "deprecated" not in w]
    for plugin in plugins:
        assert sum(f"plugin '{plugin}' (" in w for w in warnings) == 1, (plugin, warnings)
    assert len(warnings) == len(plugins), warnings


def test_well_known_configs_without_stand_ins_warn_of_nothing_but_deprecations() -> None:
    for name in ("optimized-baseline", "tiered-prefix-cache-cpu", "flow-control", "payload-agnostic"):
        config = read_config_text((CONFIGS / "wellknown" / f"{name}.yaml").read_text(), source=name)
        assert deprecations(config) == [], name
