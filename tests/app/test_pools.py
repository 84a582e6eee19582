"""Several pools without a cluster: `--pool-file` repeated, the endpoints from the config's file-discovery, each to
the pool whose selector matches its labels; what several pools refuse at start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epp.app.build import load_picker_config
from epp.app.endpoints import endpoint_source
from epp.app.pool_path import check_pools
from epp.app.settings import ConfigSource, EndpointFlags
from epp.app.state import PickerState
from epp.datastore.pool import FailureMode
from epp.errors import ConfigError

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: file-discovery
  parameters: {path: %s}
- type: random-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: random-picker}]
dataLayer:
  discovery: {pluginRef: file-discovery}
"""


def pool_file(tmp: Path, name: str, app: str, mode: str = "FailClose") -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "inference.networking.k8s.io/v1",
                "kind": "InferencePool",
                "metadata": {"name": name, "namespace": "ml"},
                "spec": {
                    "selector": {"matchLabels": {"app": app}},
                    "targetPorts": [{"number": 8000}],
                    "endpointPickerRef": {"name": "epp", "failureMode": mode},
                },
            }
        )
    )
    return str(path)


def endpoints_file(tmp: Path) -> Path:
    entries = [
        {"name": f"{app}-{i}", "address": f"127.31.{n}.{i + 1}", "port": "8000", "labels": {"app": app}}
        for n, app in enumerate(("llama", "qwen", "other"), 1)
        for i in range(2)
    ]
    path = tmp / "endpoints.json"
    path.write_text(json.dumps({"endpoints": entries}))
    return path


def test_several_pool_files_split_the_discovered_endpoints_by_their_selectors(tmp_path: Path) -> None:
    config = load_picker_config(ConfigSource(text=CONFIG % endpoints_file(tmp_path)))
    flags = EndpointFlags(
        pool_file=pool_file(tmp_path, "llama-pool", "llama"),
        more_pool_files=(pool_file(tmp_path, "qwen-pool", "qwen", "FailOpen"),),
    )
    assert flags.multi
    state = PickerState()
    endpoint_source(flags, state, config)
    assert state.pools is not None and state.pool is None
    assert {k: s.failure_mode for k, s in state.pools.specs.items()} == {
        "ml/llama-pool": FailureMode.FAIL_CLOSE,
        "ml/qwen-pool": FailureMode.FAIL_OPEN,
    }
    pools: dict[str, set[str]] = {}
    for address in state.table.addresses():
        slot = state.table.slot_of(address)
        info = state.table.info(slot) if slot is not None else None
        assert info is not None
        pools.setdefault(info.pool, set()).add(address)
    assert pools == {
        "ml/llama-pool": {"127.31.1.1:8000", "127.31.1.2:8000"},
        "ml/qwen-pool": {"127.31.2.1:8000", "127.31.2.2:8000"},
    }  # `other` is selected by no pool: left out
    assert state.source_ready()


def test_several_pool_files_refuse_a_static_list_that_cannot_tell_the_pools_apart(tmp_path: Path) -> None:
    flags = EndpointFlags(
        static_endpoints="127.31.1.1:8000",
        pool_file=pool_file(tmp_path, "a", "a"),
        more_pool_files=(pool_file(tmp_path, "b", "b"),),
    )
    with pytest.raises(ConfigError, match="cannot tell the pools apart"):
        endpoint_source(flags, PickerState(), None)


def test_several_pools_refuse_what_one_pool_alone_can_hold(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="flowControl"):
        check_pools(object(), None, False)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="federation"):
        check_pools(None, object(), False)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="precise-prefix"):
        check_pools(None, None, True)
    check_pools(None, None, False)
