"""The config keys of today's upstream, decoded as upstream decodes them.

Facts from llm-d-router @ebab687927f5:
- `apix/config/v1alpha1/endpointpickerconfig_types.go`: `requestHandler.parsers[].pluginRef`; the top-level `parser`
  and `saturationDetector` are deprecated ("If both are set, the new field is used"); `dataLayer` has `sources[]`
  (`pluginRef`, `extractors[].pluginRef`), `discovery.pluginRef`, `injectDefaults`; `FlowControlConfig` /
  `PriorityBandConfig` fields, quantities and defaults (1G, 5000, 60s, the default policy names).
- `pkg/epp/config/loader/validation.go` `validateFeatureGates`: a gate is `name` or `name=<bool>`; an unknown name
  is an error naming it; the value is parsed by strconv.ParseBool.
- `cmd/epp/runner/runner.go`: gates `flowControl` (default off) and `haPopulateNonLeaderDatastore` (default on).
- `pkg/epp/config/loader/configloader.go`: the deprecation messages, and "the flowControl config section is set but
  the flowControl feature gate is disabled; its settings (other than saturationDetector) are ignored".
- `pkg/epp/framework/interface/plugin/registry.go` `ValidatePluginStability`: an Alpha type without
  `--allow-experimental-plugins` is refused with "has Alpha stability level, but command line flag
  --allow-experimental-plugins is not set".
"""

import pytest

from epp.config.decode import parse_config
from epp.config.flowcontrol import DEFAULT_BAND_MAX_BYTES, DEFAULT_BAND_MAX_REQUESTS, DEFAULT_REQUEST_TTL_S
from epp.config.quantity import parse_quantity
from epp.errors import ConfigError
from epp.scheduling import build_scheduler
from epp.scheduling.build import deprecations

NEW = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}


def _doc(plugins=(), **kw):
    doc = dict(NEW)
    doc["plugins"] = [{"type": "queue-scorer"}, *plugins]
    doc["schedulingProfiles"] = [{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]}]
    doc.update(kw)
    return doc


@pytest.mark.parametrize(
    ("gates", "flow", "ha"),
    [
        ([], False, True),
        (["flowControl"], True, True),
        (["flowControl=true"], True, True),
        (["flowControl=false"], False, True),
        (["haPopulateNonLeaderDatastore=false"], False, False),
        (["haPopulateNonLeaderDatastore=F", "flowControl=0"], False, False),
    ],
)
def test_feature_gates_are_written_name_or_name_equals_bool(gates, flow, ha) -> None:
    config = parse_config(_doc(featureGates=gates), "g.yaml")
    assert config.gate("flowControl") is flow
    assert config.gate("haPopulateNonLeaderDatastore") is ha


def test_an_unknown_gate_is_an_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="unknown feature gate 'fastLane'"):
        parse_config(_doc(featureGates=["fastLane=true"]), "g.yaml")


def test_gates_of_the_older_api_load_with_a_warning() -> None:
    config = parse_config(_doc(featureGates=["dataLayer", "enableLegacyMetrics"]), "g.yaml")
    assert any("'enableLegacyMetrics'" in w for w in config.warnings)


def test_request_handler_parsers_in_order() -> None:
    plugins = [{"name": "a", "type": "anthropic-parser"}, {"name": "o", "type": "openai-parser"}]
    doc = _doc(plugins, requestHandler={"parsers": [{"pluginRef": "a"}, {"pluginRef": "o"}]})
    config = parse_config(doc, "p.yaml")
    assert config.parser_refs == ("a", "o")
    assert not config.warnings
    build_scheduler(config)


def test_top_level_parser_is_deprecated_and_loses_to_request_handler() -> None:
    plugins = [{"name": "a", "type": "anthropic-parser"}, {"name": "o", "type": "openai-parser"}]
    old_only = parse_config(_doc(plugins, parser={"pluginRef": "o"}), "p.yaml")
    assert old_only.parser_refs == ("o",)
    assert any("top-level 'parser' is deprecated" in w for w in old_only.warnings)
    both = parse_config(_doc(plugins, parser={"pluginRef": "o"}, requestHandler={"parsers": [{"pluginRef": "a"}]}))
    assert both.parser_refs == ("a",)


def test_a_parser_ref_must_name_a_parser() -> None:
    config = parse_config(_doc(requestHandler={"parsers": [{"pluginRef": "queue-scorer"}]}), "p.yaml")
    with pytest.raises(ConfigError, match=r"requestHandler.parsers, plugin 'queue-scorer'.*is not a parser"):
        build_scheduler(config)


def test_data_layer_sources_extractors_and_discovery() -> None:
    plugins = [
        {"type": "metrics-data-source"},
        {"type": "core-metrics-extractor"},
        {"name": "files", "type": "file-discovery", "parameters": {"path": "/etc/epp/endpoints.yaml"}},
    ]
    layer = {
        "sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]}],
        "discovery": {"pluginRef": "files"},
        "injectDefaults": False,
    }
    config = parse_config(_doc(plugins, dataLayer=layer), "d.yaml")
    assert config.data_source_refs == ("metrics-data-source", "core-metrics-extractor")
    assert config.discovery_ref == "files" and config.inject_data_defaults is False
    build_scheduler(config)


def test_a_discovery_plugin_not_named_by_the_data_layer_is_refused() -> None:
    config = parse_config(_doc([{"type": "file-discovery", "parameters": {"path": "x"}}]), "d.yaml")
    with pytest.raises(ConfigError, match=r"needs dataLayer\.discovery\.pluginRef: file-discovery"):
        build_scheduler(config)


def test_file_discovery_needs_a_path() -> None:
    config = parse_config(_doc([{"type": "file-discovery"}], dataLayer={"discovery": {"pluginRef": "file-discovery"}}))
    with pytest.raises(ConfigError, match="parameter 'path': required"):
        build_scheduler(config)


FLOW = {
    "maxBytes": "1Gi",
    "maxRequests": "1k",
    "defaultRequestTTL": "30s",
    "priorityBands": [{"priority": 10, "maxRequests": 0}, {"priority": -1, "maxBytes": "500M"}],
    "defaultNegativePriorityBand": {"maxRequests": 50},
    "saturationDetector": {"pluginRef": "utilization-detector"},
    "enableEviction": True,
}


def test_flow_control_section_decodes_with_upstreams_defaults() -> None:
    config = parse_config(_doc([{"type": "utilization-detector"}], flowControl=FLOW), "f.yaml")
    fc = config.flow_control
    assert fc is not None
    assert (fc.max_bytes, fc.max_requests) == (2**30, 1000)
    assert fc.default_request_ttl_s == 30.0 and fc.no_endpoint_request_ttl_s == 30.0  # follows the default TTL
    high, low = fc.bands
    assert (high.priority, high.max_requests, high.max_bytes) == (10, DEFAULT_BAND_MAX_REQUESTS, DEFAULT_BAND_MAX_BYTES)
    assert low.max_bytes == 500_000_000 and high.fairness_policy_ref == "global-strict-fairness-policy"
    assert fc.default_negative_band is not None and fc.default_negative_band.max_requests == 50
    assert fc.enable_eviction and config.saturation_detector_ref == "utilization-detector"
    empty = parse_config(_doc(flowControl={}), "f.yaml").flow_control
    assert empty is not None and empty.default_request_ttl_s == DEFAULT_REQUEST_TTL_S and empty.max_bytes == 0


def test_flow_control_with_the_gate_off_warns_and_loads() -> None:
    config = parse_config(_doc([{"type": "utilization-detector"}], flowControl=FLOW), "f.yaml")
    (warning,) = [w for w in config.warnings if "flowControl" in w]
    assert "gate is off" in warning and "saturationDetector" in warning and "maxBytes" in warning
    build_scheduler(config)
    only_detector = parse_config(
        _doc(
            [{"type": "utilization-detector"}],
            flowControl={"saturationDetector": {"pluginRef": "utilization-detector"}},
        )
    )
    assert not only_detector.warnings  # the detector is honoured with the gate off, so nothing is ignored


def test_flow_control_with_the_gate_on_builds_the_queues_from_the_section() -> None:
    config = parse_config(_doc(flowControl={"maxRequests": 7}, featureGates=["flowControl"]), "f.yaml")
    settings = build_scheduler(config).flow
    assert settings is not None and settings.spec.max_requests == 7
    assert build_scheduler(parse_config(_doc(flowControl={"maxRequests": 7}), "f.yaml")).flow is None


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"maxBytes": "lots"}, "flowControl.maxBytes: not a quantity"),
        ({"defaultRequestTTL": "soon"}, "flowControl.defaultRequestTTL: not a duration"),
        ({"priorityBands": [{"maxBytes": "1G"}]}, "priorityBands[0]: priority is required"),
        ({"priorityBands": [{"priority": 1}, {"priority": 1}]}, "priority 1 is configured twice"),
        ({"priorityBands": [{"priority": 1, "fairnessPolicyRef": "fair"}]}, "pluginRef 'fair' names no entry"),
        ({"priorityBands": [{"priority": 1, "weight": 2}]}, "unknown field(s) weight"),
        ({"queueDepth": 3}, "flowControl: unknown field(s) queueDepth"),
        ({"enableEviction": "yes"}, "enableEviction: expected true or false"),
    ],
)
def test_flow_control_is_validated_even_with_the_gate_off(section, words) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_doc(flowControl=section), "f.yaml")
    assert words in str(err.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [("1Gi", 2**30), ("500M", 500_000_000), ("1k", 1000), ("100", 100), (7, 7), ("1e3", 1000), ("1.5Ki", 1536)],
)
def test_quantities_read_as_kubernetes_reads_them(text, value) -> None:
    assert parse_quantity(text) == value


def test_deprecations_as_upstream_warns() -> None:
    old = {
        **_doc([{"type": "by-label", "parameters": {"label": "x"}}]),
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
    }
    old["saturationDetector"] = {"queueDepthThreshold": 3}
    warnings = deprecations(parse_config(old, "o.yaml"))
    assert any("apiVersion inference.networking.x-k8s.io/v1alpha1 is deprecated" in w for w in warnings)
    assert any("top-level saturationDetector is deprecated" in w for w in warnings)
    assert any("'by-label' is deprecated, use 'label-selector-filter'" in w for w in warnings)


def test_alpha_types_need_allow_experimental_plugins() -> None:
    doc = _doc([{"type": "session-affinity-scorer"}])
    doc["schedulingProfiles"][0]["plugins"].append({"pluginRef": "session-affinity-scorer"})
    config = parse_config(doc, "a.yaml")
    with pytest.raises(ConfigError) as err:
        build_scheduler(config)
    assert str(err.value) == (
        "a.yaml: plugin 'session-affinity-scorer' (type: 'session-affinity-scorer') has Alpha stability level, "
        "but command line flag --allow-experimental-plugins is not set"
    )
    build_scheduler(config, allow_experimental=True)


def test_saturation_detector_plugin_sets_the_pool_thresholds() -> None:
    plugins = [{"name": "sat", "type": "utilization-detector", "parameters": {"queueDepthThreshold": 9}}]
    config = parse_config(_doc(plugins, flowControl={"saturationDetector": {"pluginRef": "sat"}}), "s.yaml")
    assert build_scheduler(config).saturation.thresholds.queue_depth == 9


def test_producers_are_built_first_so_a_scorer_can_name_one() -> None:
    """Upstream builds plugins in dependency order (`pkg/epp/config/loader/configloader.go` `buildPluginDAG`): a
    scorer's `prefixMatchInfoProducerName` may name a producer listed after it."""
    from epp.scheduling.plugin_type import Kind
    from epp.scheduling.registry import builtin_registry
    from epp.scheduling.scorers import QueueScorer

    registry = builtin_registry()
    registry.register("test-producer", Kind.PRODUCER, lambda name, params, ctx: ("producer", name), "test")

    def scorer(name, params, ctx):
        producer = ctx.plugin(params.text("producerName", ""))
        params.finish()
        assert producer == ("producer", "p")
        return QueueScorer(name)

    registry.register("test-scorer", Kind.SCORER, scorer, "test")
    doc = dict(NEW)
    doc["plugins"] = [
        {"name": "s", "type": "test-scorer", "parameters": {"producerName": "p"}},
        {"name": "p", "type": "test-producer"},
    ]
    doc["schedulingProfiles"] = [{"name": "default", "plugins": [{"pluginRef": "s"}]}]
    build_scheduler(parse_config(doc, "p.yaml"), registry=registry)
