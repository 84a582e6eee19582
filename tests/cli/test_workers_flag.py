"""`--workers`: a count, or `auto` (the default) for the cores the process may use, capped (tests/app/test_cores.py),
resolved once `epp serve` knows whether its configuration can run in several processes."""

from __future__ import annotations

import argparse

import pytest

from epp.app import cores
from epp.app.serve import serving_workers
from epp.cli import serve as serve_cli
from epp.errors import ConfigError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_auto_unless_a_count_is_given() -> None:
    assert parse().workers is None
    assert parse("--workers", "auto").workers is None
    assert parse("--workers", "1").workers == 1
    assert parse("--workers", "3").workers == 3


def test_auto_is_the_usable_cores_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cores, "usable_cores", lambda: 32)
    assert serving_workers(None, []) == cores.MAX_DEFAULT_WORKERS
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    assert serving_workers(None, []) == 2


def test_auto_is_one_process_where_the_configuration_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cores, "usable_cores", lambda: 8)
    assert serving_workers(None, ["the flowControl feature gate"]) == 1


def test_an_explicit_count_is_kept_or_refused() -> None:
    assert serving_workers(1, ["federation"]) == 1
    assert serving_workers(4, []) == 4
    with pytest.raises(ConfigError, match="does not combine with federation"):
        serving_workers(2, ["federation"])


@pytest.mark.parametrize("text", ["0", "-1", "many", "65"])
def test_a_bad_count_is_refused(text: str) -> None:
    with pytest.raises(SystemExit):
        parse("--workers", text)
