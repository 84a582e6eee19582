"""`file-discovery`: endpoints and labels from a file, reloaded when it changes.

Facts from llm-d-router @ebab687927f5 `pkg/epp/framework/plugins/datalayer/discovery/file/README.md` and
`plugin.go`: the file is `endpoints: [{name, namespace (default "default"), address (IPv4), port (string,
1-65535), labels}]`, YAML or JSON, at most 1 MiB; a bad entry is logged and skipped; a file that cannot be read or
parsed fails the start; with `watchFile` a write, create or remove reloads it, re-attaching after an atomic rename
or a ConfigMap symlink swap; endpoints gone from the file are deleted; a failed reload logs and keeps the state.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from epp.datastore.table import EndpointTable
from epp.discovery.file import FileDiscovery, parse_endpoints
from epp.errors import ConfigError

GOOD = """
endpoints:
- name: d0
  address: "127.10.0.1"
  port: "8000"
  labels: {llm-d.ai/role: decode, inference.networking.k8s.io/engine-type: sglang}
- name: p0
  namespace: team-a
  address: 127.10.0.2
  port: "8001"
  labels: {llm-d.ai/role: prefill}
"""


def test_entries_become_endpoints_with_their_labels() -> None:
    endpoints, problems = parse_endpoints(GOOD.encode(), "e.yaml")
    assert problems == []
    d0, p0 = endpoints
    assert (d0.address, d0.pod_name, d0.engine) == ("127.10.0.1:8000", "d0", "sglang")
    assert d0.labels["llm-d.ai/role"] == "decode"
    assert (p0.address, p0.engine, dict(p0.labels)) == ("127.10.0.2:8001", "vllm", {"llm-d.ai/role": "prefill"})


def test_json_is_read_too() -> None:
    doc = {"endpoints": [{"name": "a", "address": "127.10.0.3", "port": "9000"}]}
    endpoints, _ = parse_endpoints(json.dumps(doc).encode(), "e.json")
    assert [e.address for e in endpoints] == ["127.10.0.3:9000"]


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"address": "127.10.0.9", "port": "80"}, "'name' is required"),
        ({"name": "x", "address": "localhost", "port": "80"}, "invalid IPv4 address 'localhost'"),
        ({"name": "x", "address": "::1", "port": "80"}, "invalid IPv4 address"),
        ({"name": "x", "address": "127.10.0.9", "port": "0"}, "invalid port '0'"),
        ({"name": "x", "address": "127.10.0.9", "port": "70000"}, "invalid port"),
        ({"name": "x", "address": "127.10.0.9", "port": "http"}, "invalid port"),
        ({"name": "x", "address": "127.10.0.9", "port": "80", "labels": ["a"]}, "'labels' must be a mapping"),
        ({"name": "d0", "address": "127.10.0.9", "port": "80"}, "the name repeats an earlier entry"),
        ({"name": "y", "address": "127.10.0.1", "port": "8000"}, "127.10.0.1:8000 repeats an earlier entry"),
    ],
)
def test_a_bad_entry_is_skipped_with_its_reason(entry, words) -> None:
    doc = {"endpoints": [{"name": "d0", "address": "127.10.0.1", "port": "8000"}, entry]}
    endpoints, problems = parse_endpoints(json.dumps(doc).encode(), "e.json")
    assert [e.pod_name for e in endpoints] == ["d0"]
    assert len(problems) == 1 and words in problems[0]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"endpoints: [", "not valid YAML or JSON"),
        (b"- a\n- b\n", "expected a mapping with 'endpoints'"),
        (b"endpoints: {a: 1}", "'endpoints' must be a list"),
        (b"pods: []", "unknown key(s) pods"),
        (b"#" * ((1 << 20) + 1), "exceeds the 1 MiB limit"),
    ],
)
def test_a_bad_file_is_refused(data, words) -> None:
    with pytest.raises(ConfigError) as err:
        parse_endpoints(data, "e.yaml")
    assert str(err.value).startswith("e.yaml: ") and words in str(err.value)


def test_a_missing_file_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the endpoints file"):
        FileDiscovery(EndpointTable(), str(tmp_path / "none.yaml"), watch=False).load()


def _file(tmp_path: Path, name: str, *addresses: str) -> Path:
    path = tmp_path / name
    entries = [{"name": f"e{i}", "address": a, "port": "8000"} for i, a in enumerate(addresses)]
    path.write_text(json.dumps({"endpoints": entries}))
    return path


async def _until(predicate, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def test_first_load_fills_the_table_and_marks_it_synced(tmp_path: Path) -> None:
    table = EndpointTable()
    assert not table.synced
    FileDiscovery(table, str(_file(tmp_path, "e.json", "127.10.0.1", "127.10.0.2")), watch=False).load()
    assert table.synced and sorted(table.addresses()) == ["127.10.0.1:8000", "127.10.0.2:8000"]


def test_watch_follows_writes_renames_and_symlink_swaps(tmp_path: Path) -> None:
    async def scenario() -> None:
        table = EndpointTable()
        link = tmp_path / "endpoints.json"
        os.symlink(_file(tmp_path, "v1.json", "127.10.0.1", "127.10.0.2"), link)
        feeder = FileDiscovery(table, str(link), watch=True, poll_interval_s=0.02)
        feeder.load()
        task = asyncio.ensure_future(feeder.run())
        try:
            # a write in place (the link's target): an endpoint gone from the file is deleted
            _file(tmp_path, "v1.json", "127.10.0.1")
            await _until(lambda: table.addresses() == ["127.10.0.1:8000"])
            # a ConfigMap-style swap: the link now points at another file
            new = _file(tmp_path, "v2.json", "127.10.0.3")
            tmp_link = tmp_path / "swap"
            os.symlink(new, tmp_link)
            os.replace(tmp_link, link)
            await _until(lambda: table.addresses() == ["127.10.0.3:8000"])
            # an atomic rename over the target of the link, and writes keep being seen after it
            staged = _file(tmp_path, "staged.json", "127.10.0.4", "127.10.0.5")
            os.replace(staged, new)
            await _until(lambda: sorted(table.addresses()) == ["127.10.0.4:8000", "127.10.0.5:8000"])
            # a broken file keeps the last good load; removing it too; a good one applies again
            new.write_text("endpoints: [")
            await _until(lambda: "not valid YAML" in feeder.last_error)
            os.remove(new)
            await _until(lambda: "cannot read" in feeder.last_error)
            assert sorted(table.addresses()) == ["127.10.0.4:8000", "127.10.0.5:8000"]
            _file(tmp_path, "v2.json", "127.10.0.6")
            await _until(lambda: table.addresses() == ["127.10.0.6:8000"])
        finally:
            task.cancel()

    asyncio.run(scenario())
