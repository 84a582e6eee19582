"""`--workers`: a count, or `auto` for the cores the process may use (affinity and cgroup quota), capped."""

from __future__ import annotations

import argparse
import os

import pytest

from epp.cli import serve as serve_cli


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_one_process_unless_asked() -> None:
    assert parse().workers == 1
    assert parse("--workers", "3").workers == 3


def test_auto_is_the_usable_cores_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_cli, "usable_cores", lambda: 32)
    assert parse("--workers", "auto").workers == serve_cli.MAX_DEFAULT_WORKERS
    monkeypatch.setattr(serve_cli, "usable_cores", lambda: 2)
    assert parse("--workers", "auto").workers == 2


def test_usable_cores_never_exceeds_the_affinity() -> None:
    assert 1 <= serve_cli.usable_cores() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize("text", ["0", "-1", "many", "65"])
def test_a_bad_count_is_refused(text: str) -> None:
    with pytest.raises(SystemExit):
        parse("--workers", text)
