"""The Kubernetes flags of `epp serve`: modes, defaults, and one clear line for every bad value."""

from __future__ import annotations

import pytest

from epp.cli import build_parser
from epp.discovery.kubernetes.settings import settings_from_flags
from epp.errors import ConfigError


def flags(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_no_kubernetes_flags_means_no_kubernetes_source() -> None:
    assert settings_from_flags(flags("--static-endpoints", "127.10.0.1:8000")) is None


def test_pool_mode_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NAMESPACE", raising=False)
    s = settings_from_flags(flags("--pool-name", "pool"))
    assert s is not None and not s.standalone
    assert (s.namespace, s.pool_group, s.leader_election) == ("default", "inference.networking.k8s.io", False)
    assert (s.lease.lease_duration_s, s.lease.renew_deadline_s, s.lease.retry_period_s) == (15.0, 10.0, 2.0)


def test_namespace_comes_from_the_environment_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAMESPACE", "models")
    assert settings_from_flags(flags("--pool-name", "pool")).namespace == "models"
    assert settings_from_flags(flags("--pool-name", "pool", "--pool-namespace", "x")).namespace == "x"


def test_standalone_mode() -> None:
    s = settings_from_flags(flags("--endpoint-selector", "app=vllm,tier==gold", "--endpoint-target-ports", "8000,8001"))
    assert s is not None and s.standalone
    spec = s.standalone_pool()
    assert (dict(spec.selector), spec.target_ports) == ({"app": "vllm", "tier": "gold"}, (8000, 8001))
    assert spec.expressions == ()


def test_standalone_selector_takes_the_full_label_selector_syntax() -> None:
    """Upstream parses --endpoint-selector with the API machinery's label-selector grammar."""
    text = "app=vllm,env in (prod, staging),tier notin (frontend),gpu,!canary,zone!=b"
    spec = settings_from_flags(flags("--endpoint-selector", text, "--endpoint-target-ports", "8000")).standalone_pool()
    assert dict(spec.selector) == {"app": "vllm"}
    assert [str(r) for r in spec.expressions] == [
        "env in (prod,staging)",
        "tier notin (frontend)",
        "gpu",
        "!canary",
        "zone!=b",
    ]
    base = {"app": "vllm", "env": "prod", "gpu": "h100"}
    assert spec.selects(base)
    assert spec.selects({**base, "env": "staging", "tier": "backend", "zone": "a"})
    assert not spec.selects({**base, "env": "dev"})
    assert not spec.selects({**base, "tier": "frontend"})
    assert not spec.selects({**base, "canary": ""})
    assert not spec.selects({**base, "zone": "b"})
    assert not spec.selects({k: v for k, v in base.items() if k != "gpu"})
    assert not spec.selects({**base, "app": "sglang"})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--pool-name", "p", "--endpoint-selector", "a=b", "--endpoint-target-ports", "1"), "exclusive"),
        (("--endpoint-selector", "a=b"), "needs --endpoint-target-ports"),
        (("--endpoint-target-ports", "8000"), "needs --endpoint-selector"),
        (("--endpoint-selector", "env in (a", "--endpoint-target-ports", "8000"), r"env in \(a.*expected: ','"),
        (("--endpoint-selector", " , ", "--endpoint-target-ports", "8000"), "expected: !, identifier"),
        (("--endpoint-selector", "   ", "--endpoint-target-ports", "8000"), "at least one requirement"),
        (("--endpoint-selector", "a=b", "--endpoint-target-ports", "80x"), "not a port"),
        (("--endpoint-selector", "a=b", "--endpoint-target-ports", "8000,8000"), "twice"),
        (("--pool-name", "p", "--pool-group", "inference.networking.x-k8s.io"), "only inference.networking.k8s.io"),
        (("--ha-enable-leader-election",), "needs --pool-name"),
        (("--pool-name", "p", "--leader-elect-renew-deadline", "20s"), "renew deadline < lease duration"),
    ],
    ids=[
        "both-modes",
        "selector-without-ports",
        "ports-without-selector",
        "bad-selector",
        "lone-comma",
        "blank-selector",
        "bad-port",
        "duplicate-port",
        "other-pool-group",
        "ha-without-source",
        "renew-after-lease",
    ],
)
def test_bad_flags_are_one_clear_config_error(argv, message) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from_flags(flags(*argv))


@pytest.mark.parametrize(
    ("value", "expected"), [("", True), ("=true", True), ("=false", False), ("=0", False)], ids=str
)
def test_leader_election_flag_takes_go_style_values(value, expected) -> None:
    argv = ["--pool-name", "p", f"--ha-enable-leader-election{value}"]
    assert settings_from_flags(flags(*argv)).leader_election is expected


def test_lease_durations_take_go_durations() -> None:
    s = settings_from_flags(
        flags(
            "--pool-name",
            "p",
            "--leader-elect-lease-duration",
            "1m",
            "--leader-elect-renew-deadline",
            "30",
            "--leader-elect-retry-period",
            "500ms",
        )
    )
    assert (s.lease.lease_duration_s, s.lease.renew_deadline_s, s.lease.retry_period_s) == (60.0, 30.0, 0.5)


def test_bad_duration_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        flags("--pool-name", "p", "--leader-elect-lease-duration", "soon")
    assert exc.value.code == 2
    assert "not a duration" in capsys.readouterr().err


@pytest.mark.process
def test_serve_with_an_unusable_kubeconfig_exits_2_with_one_line(tmp_path) -> None:
    import subprocess

    from tests.support.procs import epp_argv

    bad = tmp_path / "kubeconfig"
    bad.write_text("this: is: not a kubeconfig")
    argv = epp_argv(
        "serve",
        "--pool-name",
        "p",
        "--kubeconfig",
        str(bad),
        "--bind-address",
        "127.0.0.1",
        "--grpc-port",
        "0",
        "--grpc-health-port",
        "0",
        "--metrics-port",
        "0",
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().startswith(f"epp serve: error: --kubeconfig {bad}")
    assert len(done.stderr.strip().splitlines()) == 1


def test_one_pool_name_is_todays_single_pool_mode_and_a_repeated_one_serves_several() -> None:
    one = settings_from_flags(flags("--pool-name", "pool"))
    assert one is not None and (one.pool_name, one.pool_names, one.multi) == ("pool", (), False)
    several = settings_from_flags(flags("--pool-name", "a", "--pool-name", "b", "--pool-name", "a"))
    assert several is not None and (several.pool_name, several.pool_names, several.multi) == ("", ("a", "b"), True)
    assert not several.standalone
    chosen = settings_from_flags(flags("--pool-selector", "epp=shared"))
    assert chosen is not None and (chosen.pool_selector, chosen.multi) == ("epp=shared", True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--pool-selector", "a in ("), "--pool-selector"),
        (("--pool-name", "a", "--pool-name", "b", "--endpoint-selector", "app=x"), "exclusive"),
        (("--pool-name", ""), "--pool-name: an empty name"),
    ],
)
def test_bad_pool_sets_are_refused_with_one_line(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from_flags(flags(*argv))
