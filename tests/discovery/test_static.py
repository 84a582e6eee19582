from pathlib import Path

import pytest

from epp.datastore.pool import FailureMode
from epp.discovery.static import load_pool_file, parse_static_endpoints
from epp.errors import ConfigError

POOL_YAML = """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: vllm-llama3, namespace: team-a}
spec:
  selector: {matchLabels: {app: vllm-llama3}}
  targetPorts: [{number: 8000}, {number: 8001}]
  endpointPickerRef: {name: epp, port: {number: 9002}, failureMode: FailOpen}
"""


def test_static_endpoints_parse_ipv4_ipv6_and_bare_ips_with_pool_ports() -> None:
    got = parse_static_endpoints("127.0.0.1:8000, [::1]:8001,127.0.0.2", default_ports=(9000, 9001))
    assert [e.address for e in got] == ["127.0.0.1:8000", "[::1]:8001", "127.0.0.2:9000", "127.0.0.2:9001"]


def test_explicitly_empty_static_endpoints_is_an_empty_pool() -> None:
    assert parse_static_endpoints("") == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("host.example:8000", "not an IP address"),
        ("127.0.0.1:0", "no valid port"),
        ("127.0.0.1:http", "no valid port"),
        ("127.0.0.1", "needs a port"),
        ("127.0.0.1:8000,127.0.0.1:8000", "listed twice"),
        (",,", "no endpoint"),
    ],
    ids=["hostname", "port-zero", "port-name", "no-port", "duplicate", "only-commas"],
)
def test_bad_static_endpoints_name_the_problem(text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        parse_static_endpoints(text)


def test_pool_file_gives_failure_mode_and_ports(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(POOL_YAML)
    pool = load_pool_file(str(path))
    assert pool.failure_mode is FailureMode.FAIL_OPEN
    assert pool.target_ports == (8000, 8001)
    assert pool.namespace == "team-a"


def test_a_pool_file_without_endpoint_picker_ref_loads_as_fail_close(tmp_path: Path) -> None:
    """InferencePool v1 made `endpointPickerRef` optional; without it there is no failureMode to read."""
    path = tmp_path / "pool.yaml"
    path.write_text("\n".join(line for line in POOL_YAML.splitlines() if "endpointPickerRef" not in line))
    pool = load_pool_file(str(path))
    assert (pool.failure_mode, pool.target_ports, pool.epp_service) == (FailureMode.FAIL_CLOSE, (8000, 8001), "")
    assert pool.selects({"app": "vllm-llama3"})


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a: [", "not valid YAML"),
        ("kind: Service", "no InferencePool"),
        (POOL_YAML.replace("FailOpen", "Sometimes"), "failureMode must be FailOpen or FailClose"),
        (POOL_YAML.replace("inference.networking.k8s.io/v1", "inference.networking.x-k8s.io/v1alpha2"), "apiVersion"),
        (POOL_YAML.replace("[{number: 8000}, {number: 8001}]", "[]"), "targetPorts"),
    ],
    ids=["yaml", "kind", "failure-mode", "api-version", "no-ports"],
)
def test_bad_pool_files_name_the_file_and_field(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=reason) as err:
        load_pool_file(str(path))
    assert str(path) in str(err.value)


def test_missing_pool_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_pool_file(str(tmp_path / "absent.yaml"))
