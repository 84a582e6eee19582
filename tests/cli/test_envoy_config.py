"""`epp envoy-config`: a pool file and a few flags in, a bootstrap out; bad input is one line and exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from epp.cli import main

POOL = """\
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: vllm-pool, namespace: ai}
spec:
  selector: {matchLabels: {app: vllm}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: epp, port: {number: 9002}, failureMode: MODE}
"""


def pool_file(tmp_path: Path, mode: str) -> str:
    path = tmp_path / f"pool-{mode}.yaml"
    path.write_text(POOL.replace("MODE", mode))
    return str(path)


def ext_proc_of(config: dict) -> dict:  # type: ignore[type-arg]
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return manager["http_filters"][0]["typed_config"]  # type: ignore[no-any-return]


def test_a_fail_open_pool_renders_fail_open_routing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["envoy-config", "--pool-file", pool_file(tmp_path, "FailOpen"), "--epp", "127.0.0.1:9002"]
    assert main([*argv, "--endpoints", "127.10.0.1:8000,127.10.0.2:8000", "--listen", "127.0.0.1:8081"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert ext_proc_of(config)["failure_mode_allow"] is True
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert listener == {"address": "127.0.0.1", "port_value": 8081}


def test_output_goes_to_a_file_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "envoy.yaml"
    argv = ["envoy-config", "--pool-file", pool_file(tmp_path, "FailClose"), "--epp", "epp.ai.svc:9002"]
    assert main([*argv, "--body-mode", "FULL_DUPLEX_STREAMED", "-o", str(out)]) == 0
    assert capsys.readouterr().out == ""
    config = yaml.safe_load(out.read_text())
    assert ext_proc_of(config)["processing_mode"]["request_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert ext_proc_of(config)["status_on_error"] == {"code": "ServiceUnavailable"}


@pytest.mark.parametrize(
    ("mode", "extra", "message"),
    [
        ("FailOpen", [], "FailOpen needs the pool's endpoints"),
        (
            "FailOpen",
            ["--endpoints-dns", "vllm", "--body-mode", "FULL_DUPLEX_STREAMED"],
            "--allow-full-duplex-fail-open",
        ),
        ("FailClose", ["--endpoints", "vllm:8000"], "use --endpoints-dns"),
        ("FailClose", ["--epp", "127.0.0.1"], "missing ':port'"),
        ("FailClose", ["--listen", "127.0.0.1:99999"], "out of range"),
    ],
    ids=["fail-open-no-members", "fail-open-full-duplex", "dns-in-endpoints", "epp-no-port", "listen-port"],
)
def test_inconsistent_flags_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str, extra: list[str], message: str
) -> None:
    argv = ["envoy-config", "--pool-file", pool_file(tmp_path, mode), "--epp", "127.0.0.1:9002", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("epp envoy-config: error: ")
    assert message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pool-file", "/nonexistent/pool.yaml", "--epp", "127.0.0.1:9002"], "cannot read"),
        (["--epp", "127.0.0.1:9002"], "--pool-file"),
        (["--endpoints", "127.10.0.1:1", "--endpoints-dns", "x"], "not allowed with argument"),
        (["--body-mode", "STREAMED"], "invalid choice"),
    ],
    ids=["missing-pool-file", "no-pool-file", "two-member-sources", "body-mode"],
)
def test_bad_arguments_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    if "--pool-file" not in args and "--epp" not in args:
        args = ["--pool-file", pool_file(tmp_path, "FailClose"), "--epp", "127.0.0.1:9002", *args]
    try:
        code = main(["envoy-config", *args])
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
