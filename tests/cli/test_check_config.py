from pathlib import Path

import pytest

from epp.cli import main

GOOD = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: prefix-cache-scorer
  parameters: {blockSize: 32}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
federation:
  residency: {rules: []}
"""


def test_a_good_file_exits_0_and_describes_the_profile(tmp_path: Path, capsys) -> None:
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ok: " in out and "queue-scorer×2" in out and "federation" in out
    # the effective profile: every plugin with its parameters after defaults, the added ones marked
    assert (
        'plugin prefix-cache-scorer (prefix-cache-scorer, scorer): {"autoTune": true, "blockSize": 32, '
        '"lruCapacityPerServer": 31250, "maxPrefixBlocksToMatch": 256}'
    ) in out
    assert 'plugin max-score-picker (max-score-picker, picker) (added): {"maxNumOfEndpoints": 1}' in out
    assert "plugin passthrough-parser (passthrough-parser, parser) (added): {}" in out
    assert "parsers: openai-parser, anthropic-parser, vllmhttp-parser, passthrough-parser" in out
    assert "warning: apiVersion inference.networking.x-k8s.io/v1alpha1 is deprecated" in out


def test_alpha_types_need_the_flag(tmp_path: Path, capsys) -> None:
    path = tmp_path / "alpha.yaml"
    path.write_text(GOOD.replace("- type: queue-scorer\n", "- type: queue-scorer\n- type: session-affinity-scorer\n"))
    assert main(["check-config", str(path)]) == 1
    assert "--allow-experimental-plugins is not set" in capsys.readouterr().out
    assert main(["check-config", "--allow-experimental-plugins", str(path)]) == 0


def test_a_refused_file_exits_1_with_the_reason(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("- type: queue-scorer\n", "- name: queue-scorer\n  type: queue-scorerr\n"))
    assert main(["check-config", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"refused: {path}: plugin 'queue-scorer': type 'queue-scorerr': not implemented" in out


@pytest.mark.parametrize(
    ("name", "rc"),
    [
        ("gie-integration-default-config.yaml", 0),
        ("llmd-router-pd-epp-config.yaml", 0),
        ("gie-configloader_1_test.yaml", 1),
    ],
    ids=["loads", "pd-loads", "refused"],
)
def test_reference_configs(reference_data: Path, name, rc, capsys) -> None:
    assert main(["check-config", str(reference_data / "epp-configs" / name)]) == rc


EXTRACTOR = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: metrics-data-source
- type: core-metrics-extractor
  parameters:
    defaultEngine: vllm
    engineConfigs:
    - name: my-engine
      queuedRequestsSpec: "my_queue_depth"
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
dataLayer:
  sources:
  - pluginRef: metrics-data-source
"""


def test_engine_metric_names_from_the_config_are_accepted_and_checked(tmp_path: Path, capsys) -> None:
    path = tmp_path / "extractor.yaml"
    path.write_text(EXTRACTOR)
    assert main(["check-config", str(path)]) == 0
    path.write_text(EXTRACTOR.replace("queuedRequestsSpec", "queuedRequestSpec"))
    assert main(["check-config", str(path)]) == 1
    assert "queuedRequestSpec" in capsys.readouterr().out
