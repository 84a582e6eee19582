"""Phase two: plugin objects, upstream's defaults, and refusals that name the plugin."""

import pytest

from epp.config.decode import parse_config
from epp.errors import ConfigError
from epp.scheduling import build_scheduler, default_config, upstream_default_config
from epp.scheduling.pickers import MaxScorePicker, RandomPicker

BASE = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}


def _config(plugins, profile_plugins, **kw):
    return parse_config(
        {**BASE, "plugins": plugins, "schedulingProfiles": [{"name": "p", "plugins": profile_plugins}], **kw},
        "cfg.yaml",
    )


def test_defaults_weight_one_and_max_score_picker() -> None:
    scheduler = build_scheduler(_config([{"type": "queue-scorer"}], [{"pluginRef": "queue-scorer"}]))
    (scorer,) = scheduler.handler.profile.scorers
    assert scorer.weight == 1.0
    assert isinstance(scheduler.handler.profile.picker, MaxScorePicker)


def test_parameters_reach_the_plugin() -> None:
    scheduler = build_scheduler(
        _config(
            [{"name": "pick", "type": "random-picker", "parameters": {"maxNumOfEndpoints": 3}}],
            [{"pluginRef": "pick"}],
            saturationDetector={"queueDepthThreshold": 9},
        )
    )
    assert isinstance(scheduler.handler.profile.picker, RandomPicker)
    assert scheduler.handler.profile.picker.max_endpoints == 3
    assert scheduler.saturation.thresholds.queue_depth == 9


REFUSALS = [
    pytest.param(
        [{"name": "x", "type": "magic-scorer"}], [{"pluginRef": "x"}], "plugin 'x': type 'magic-scorer'", id="unknown"
    ),
    pytest.param(
        [{"name": "pc", "type": "prefix-cache-scorer", "parameters": {"blocksize": 4}}],
        [{"pluginRef": "pc"}],
        "plugin 'pc' (prefix-cache-scorer): unknown parameter(s) blocksize",
        id="misspelt-parameter",
    ),
    pytest.param(
        [{"name": "pc", "type": "prefix-cache-scorer", "parameters": {"blockSize": "big"}}],
        [{"pluginRef": "pc"}],
        "parameter 'blockSize': expected an integer",
        id="bad-parameter-type",
    ),
    pytest.param(
        [{"type": "max-score-picker"}, {"type": "random-picker"}],
        [{"pluginRef": "max-score-picker"}, {"pluginRef": "random-picker"}],
        "more than one picker",
        id="two-pickers",
    ),
    pytest.param(
        [{"type": "max-score-picker"}],
        [{"pluginRef": "max-score-picker", "weight": 2}],
        "a weight applies to scorers only",
        id="weight-on-picker",
    ),
    pytest.param(
        [{"type": "single-profile-handler"}],
        [{"pluginRef": "single-profile-handler"}],
        "profile handler cannot be part of a profile",
        id="handler-in-profile",
    ),
    pytest.param(
        [{"name": "lf", "type": "label-filter"}], [{"pluginRef": "lf"}], "matchLabels", id="label-filter-no-labels"
    ),
]


@pytest.mark.parametrize(("plugins", "refs", "words"), REFUSALS)
def test_build_refusals_name_file_plugin_and_why(plugins, refs, words) -> None:
    with pytest.raises(ConfigError) as err:
        build_scheduler(_config(plugins, refs))
    assert str(err.value).startswith("cfg.yaml: ")
    assert words in str(err.value)


def test_two_profiles_without_a_disaggregating_handler_are_refused() -> None:
    config = parse_config(
        {
            **BASE,
            "plugins": [{"type": "queue-scorer"}],
            "schedulingProfiles": [
                {"name": "prefill", "plugins": [{"pluginRef": "queue-scorer"}]},
                {"name": "decode", "plugins": [{"pluginRef": "queue-scorer"}]},
            ],
        },
        "cfg.yaml",
    )
    with pytest.raises(ConfigError, match="single-profile-handler runs exactly one; use disagg-profile-handler"):
        build_scheduler(config)


def test_upstream_default_profile_is_unchanged() -> None:
    profile = build_scheduler(upstream_default_config()).handler.profile
    assert [(s.scorer.type_name, s.weight) for s in profile.scorers] == [
        ("queue-scorer", 2.0),
        ("kv-cache-utilization-scorer", 2.0),
        ("prefix-cache-scorer", 3.0),
    ]
    assert not profile.filters


def test_our_default_adds_inflight_load_and_saturation_filter() -> None:
    profile = build_scheduler(None).handler.profile
    assert [f.type_name for f in profile.filters] == ["utilization-detector"]
    assert ("inflight-load-scorer", 2.0) in [(s.scorer.type_name, s.weight) for s in profile.scorers]
    assert default_config().source == "<built-in default>"


def _detector_config(parameters: dict | None, **kw: object):  # type: ignore[type-arg]
    plugins = [{"name": "sat", "type": "utilization-detector", "parameters": parameters or {}}]
    return _config(plugins, [{"pluginRef": "sat"}], **kw)


@pytest.mark.parametrize(
    ("config", "staleness"),
    [
        pytest.param(None, 2.0, id="no-config-the-flags"),
        pytest.param(_detector_config(None), 2.0, id="not-given-the-flags"),
        pytest.param(_detector_config({"metricsStalenessThreshold": "200ms"}), 0.2, id="plugin-parameter"),
        pytest.param(
            _detector_config(None, saturationDetector={"metricsStalenessThreshold": "150ms"}), 0.15, id="top-level"
        ),
        pytest.param(
            _detector_config({"metricsStalenessThreshold": "1s"}, saturationDetector={"metricsStalenessThreshold": 1}),
            1.0,
            id="both-the-same",
        ),
    ],
)
def test_the_pool_has_one_staleness_threshold(config, staleness: float) -> None:
    from epp.datastore import Freshness

    scheduler = build_scheduler(config, freshness=Freshness(staleness_s=2.0, max_failures=5))
    assert scheduler.freshness == Freshness(staleness_s=staleness, max_failures=5)
    assert scheduler.saturation.freshness is scheduler.freshness  # the detector decides on the same data


def test_two_different_staleness_thresholds_are_refused() -> None:
    config = _detector_config({"metricsStalenessThreshold": "1s"}, saturationDetector={"metricsStalenessThreshold": 2})
    with pytest.raises(ConfigError, match="one staleness threshold per pool"):
        build_scheduler(config)
