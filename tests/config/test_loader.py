"""Phase one (read, decode, validate) and the verdict on every upstream reference config."""

from pathlib import Path

import pytest

from epp.app.config_file import load_config
from epp.config.decode import parse_config
from epp.config.files import read_config
from epp.errors import ConfigError

REFERENCE_VERDICTS = {
    # file → None (loads) or the words the refusal must contain
    "gie-integration-default-config.yaml": None,
    "llmd-router-epp-config.yaml": None,
    "llmd-router-sim-program-aware-config.yaml": None,
    "llmd-router-probabilistic-admitter-epp-config.yaml": None,
    # alpha usage-limit policy: loads with --allow-experimental-plugins (tests/flowcontrol/test_upstream_samples.py)
    "llmd-router-soft-reflective-ceiling-epp-config.yaml": ("has Alpha stability level",),
    "gie-configloader_1_test.yaml": ("plugin 'test1'", "type 'test-one'", "not implemented"),
    "gie-integration-datalayer-config.yaml": ("plugin 'mock-metrics-source'", "not implemented"),
    "llmd-router-precise-prefix-cache-config.yaml": None,
    "llmd-router-chart-predicted-latency-config.yaml": None,
    "llmd-router-pd-epp-config.yaml": None,
    "llmd-router-sim-pd-epp-config.yaml": None,
}


def test_every_reference_config_has_a_verdict(reference_data: Path) -> None:
    files = {p.name for p in (reference_data / "epp-configs").iterdir()}
    assert files == set(REFERENCE_VERDICTS), "a new reference config needs a verdict in this table"


@pytest.mark.parametrize(("name", "refusal"), REFERENCE_VERDICTS.items(), ids=list(REFERENCE_VERDICTS))
def test_reference_config_loads_or_is_refused_precisely(reference_data: Path, name, refusal) -> None:
    path = reference_data / "epp-configs" / name
    if refusal is None:
        config = load_config(path)
        assert config.source == str(path)
        return
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(str(path))
    assert "\n" not in message  # one line, as the server logs it
    for words in refusal:
        assert words in message


BASE = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig"}


def _doc(**kw):
    doc = dict(BASE)
    doc.setdefault("plugins", [{"type": "queue-scorer"}])
    doc.setdefault("schedulingProfiles", [{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]}])
    doc.update(kw)
    return doc


REFUSALS = [
    pytest.param(_doc(scheduling={}), "unknown key(s) scheduling", id="unknown-top-level-key"),
    pytest.param(_doc(apiVersion="v1"), "apiVersion", id="wrong-api-version"),
    pytest.param(_doc(kind="Pod"), "kind", id="wrong-kind"),
    pytest.param(_doc(plugins=[{"name": "a"}]), "plugins[0].type", id="plugin-without-type"),
    pytest.param(
        _doc(plugins=[{"type": "queue-scorer"}, {"type": "queue-scorer"}]), "defined twice", id="duplicate-plugin"
    ),
    pytest.param(
        _doc(schedulingProfiles=[{"name": "p", "plugins": [{"pluginRef": "nope"}]}]),
        "plugin 'nope'': pluginRef names no entry",
        id="dangling-plugin-ref",
    ),
    pytest.param(
        _doc(schedulingProfiles=[{"name": "p", "plugins": [{"pluginRef": "queue-scorer", "weight": -1}]}]),
        "weight must be >= 0",
        id="negative-weight",
    ),
    pytest.param(_doc(schedulingProfiles=[]), "at least one profile", id="no-profiles"),
    pytest.param(_doc(featureGates=["warpDrive"]), "unknown feature gate 'warpDrive'", id="unknown-gate"),
    pytest.param(_doc(saturationDetector={"queueDepth": 3}), "unknown field(s) queueDepth", id="saturation-typo"),
    pytest.param(_doc(saturationDetector={"metricsStalenessThreshold": "soon"}), "not a duration", id="bad-staleness"),
    pytest.param(_doc(flowControl=[]), "flowControl: expected a mapping", id="flow-control-not-mapping"),
    pytest.param(_doc(featureGates=["flowControl=maybe"]), "'maybe' is not a valid value", id="gate-bad-value"),
    pytest.param(_doc(federation=["x"]), "federation: expected a mapping", id="federation-not-mapping"),
    pytest.param(None, "empty", id="empty-file"),
]


@pytest.mark.parametrize(("doc", "words"), REFUSALS)
def test_structural_refusals_name_the_field(doc, words) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(doc, "cfg.yaml")
    assert str(err.value).startswith("cfg.yaml: ")
    assert words.replace("''", "'") in str(err.value)


def test_federation_is_kept_raw_for_the_federation_policy() -> None:
    config = parse_config(_doc(federation={"residency": [{"model": "m", "sites": ["eu"]}]}), "cfg.yaml")
    assert config.federation == {"residency": [{"model": "m", "sites": ["eu"]}]}


def test_saturation_block_and_defaults() -> None:
    config = parse_config(
        _doc(saturationDetector={"queueDepthThreshold": 8, "metricsStalenessThreshold": "150ms", "headroom": 0.2}),
        "cfg.yaml",
    )
    t = config.saturation
    assert (t.queue_depth, t.kv_util, t.staleness_s, t.headroom) == (8, 0.8, pytest.approx(0.15), 0.2)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        pytest.param("plugins: [", "not valid YAML at line", id="yaml-syntax"),
        pytest.param("a: 1\n---\nb: 2\n", "2 YAML documents", id="two-documents"),
    ],
)
def test_file_level_refusals(tmp_path: Path, content, words) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=words):
        read_config(path)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_config(tmp_path / "absent.yaml")


def test_benchmark_configs_load() -> None:
    configs = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "configs").glob("*.yaml"))
    assert configs
    for path in configs:
        if "--allow-experimental-plugins" not in path.read_text():
            load_config(path)
            continue
        # a file that says it needs the flag uses an Alpha type: refused without it, loads with it
        with pytest.raises(ConfigError, match="Alpha stability"):
            load_config(path)
        load_config(path, allow_experimental=True)
