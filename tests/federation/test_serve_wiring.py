"""`epp serve` federation wiring: when federation is on, the config section, and the FailOpen start-time check."""

from pathlib import Path

import pytest

from epp.app.config_file import load_config
from epp.app.federation import build_federation
from epp.app.settings import FederationFlags
from epp.cli import main
from epp.datastore.pool import FailureMode
from epp.errors import ConfigError

FED = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins: [{type: queue-scorer}]
schedulingProfiles: [{name: default, plugins: [{pluginRef: queue-scorer}]}]
federation:
  sites: {dc-1: "127.30.0.1:8080"}
  residency:
    rules:
      - {name: eu-data, modelPrefixes: ["eu/"], tiers: [eu]}
"""

POOL = """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: pool}
spec:
  selector: {matchLabels: {app: vllm}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: epp, port: {number: 9002}, failureMode: FailOpen}
"""


def _args(tier: str = "", watch: bool = False, allow_fail_open: bool = False) -> FederationFlags:
    return FederationFlags(tier=tier, watch=watch, allow_fail_open=allow_fail_open)


def test_federation_is_off_unless_asked_for() -> None:
    assert build_federation(_args(), FailureMode.FAIL_CLOSE) is None


def test_tier_alone_turns_it_on_with_no_rules() -> None:
    parts = build_federation(_args(tier="eu"), FailureMode.FAIL_OPEN)
    assert parts is not None and parts.router.local_tier == "eu" and parts.sites.synced
    assert parts.report(0.0)["federation"]["sites"] == []


def test_config_section_comes_from_the_picker_config(tmp_path: Path) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(FED)
    parts = build_federation(_args(tier="eu", watch=True), FailureMode.FAIL_CLOSE, load_config(path))
    assert parts is not None and not parts.sites.synced  # the watch has not listed yet
    assert [r.name for r in parts.config.rules] == ["eu-data"]
    assert dict(parts.config.site_addresses) == {"dc-1": "127.30.0.1:8080"}


def test_bad_section_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(FED.replace("sites: {", "site: {"))
    with pytest.raises(ConfigError, match=r"federation\.site: unknown field") as exc:
        build_federation(_args(tier="eu"), FailureMode.FAIL_CLOSE, load_config(path))
    assert str(path) in str(exc.value)


def test_serve_refuses_a_fail_open_pool_that_would_leak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "epp.yaml").write_text(FED)
    (tmp_path / "pool.yaml").write_text(POOL)
    argv = ["serve", "--static-endpoints", "127.10.0.1:8000", "--pool-file", str(tmp_path / "pool.yaml")]
    argv += ["--config-file", str(tmp_path / "epp.yaml"), "--tier", "us", "--metrics-port", "0"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "FailOpen" in err and "eu-data" in err and "--federation-allow-fail-open" in err


def test_check_config_gives_the_servers_verdict_on_the_federation_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(FED)
    bad.write_text(FED.replace("tiers: [eu]", "tiers: eu"))
    assert main(["check-config", str(good)]) == 0
    assert "federation: residency rules eu-data; stale sites excluded" in capsys.readouterr().out
    assert main(["check-config", str(bad)]) == 1
    assert "federation.residency.rules[0].tiers: must be a list" in capsys.readouterr().out
