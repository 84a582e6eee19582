"""The table of upstream plugin types matches the registry and docs/scheduling.md.

Facts from llm-d-router @ebab687927f5 `cmd/epp/runner/runner.go` `registerInTreePlugins()`: the type names and
their stability (`fwkplugin.StabilityAlpha` / `StabilityBeta`); `pkg/epp/framework/plugins/.../bylabel` for the
deprecated `by-label`.
"""

from pathlib import Path

import pytest

from epp.scheduling.plugin_type import Stability
from epp.scheduling.registry import builtin_registry
from epp.scheduling.upstream_types import UPSTREAM_TYPES, Status

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduling.md"
OWN_TYPES = {
    "inflight-load-scorer",
    "label-filter",
    "prefill-queue-scorer",
    "rendezvous-picker",
    "saturation-filter",
    "self-calibrating-detector",
}


def test_every_registered_type_is_upstreams_or_our_own() -> None:
    upstream = {t.type_name for t in UPSTREAM_TYPES}
    assert set(builtin_registry().names()) - upstream == OWN_TYPES


@pytest.mark.parametrize("entry", UPSTREAM_TYPES, ids=[t.type_name for t in UPSTREAM_TYPES])
def test_table_matches_the_registry(entry) -> None:
    plugin_type = builtin_registry().get(entry.type_name)
    assert (plugin_type is not None) == (entry.status is not Status.REFUSED)
    if plugin_type is not None:
        assert (plugin_type.stability is Stability.ALPHA) == entry.alpha


@pytest.mark.parametrize("entry", UPSTREAM_TYPES, ids=[t.type_name for t in UPSTREAM_TYPES])
def test_docs_list_every_upstream_type_with_its_status(entry) -> None:
    row = (
        f"| `{entry.type_name}` | {entry.kind} | {'alpha' if entry.alpha else 'beta'} | {entry.status.value} | "
        f"{entry.why or '—'} |"
    )
    assert row in DOC.read_text()


def test_no_type_is_listed_twice() -> None:
    names = [t.type_name for t in UPSTREAM_TYPES]
    assert len(names) == len(set(names))
