"""Upstream's `file-discovery`: the pool's endpoints from a YAML or JSON file instead of a cluster.

The file (llm-d-router `pkg/epp/framework/plugins/datalayer/discovery/file/README.md`):

    endpoints:
      - name: vllm-0            # required, unique in the file
        namespace: default      # optional, "default"
        address: "127.10.0.7"   # required, an IPv4 literal
        port: "8000"            # required, 1-65535 (a string upstream; a YAML number is read too)
        labels: {llm-d.ai/role: decode}

As upstream: the file is at most 1 MiB; a bad entry is logged and skipped, a file that cannot be read or parsed
fails the start; with `watchFile` the file is read again when it changes, including after an atomic rename or a
ConfigMap symlink swap, and endpoints gone from it are deleted; a reload of a broken file is logged and changes
nothing. Readiness follows the first good load. Labels reach the endpoint table, so label filters (`decode-filter`,
`label-filter`, ...) see them; the engine label (`inference.networking.k8s.io/engine-type`) picks the metric names.

Changes are noticed by polling: every `poll_interval_s` the path is stat'ed (following symlinks) and a change of
inode, device, size or mtime triggers a reload. Polling needs no inotify and sees a rename or a swapped symlink as
any other change; a second of delay is nothing for a list of endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from epp.datastore import EndpointInfo
from epp.datastore.table import EndpointTable
from epp.errors import ConfigError
from epp.wire import ENGINE_LABEL

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 1 << 20  # upstream's cap
DEFAULT_NAMESPACE = "default"
DEFAULT_ENGINE = "vllm"
DEFAULT_POLL_INTERVAL_S = 1.0


def _entry(raw: object, index: int) -> tuple[str, EndpointInfo]:
    """One entry → (namespace/name, endpoint); ValueError says what is wrong with it."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"entry {index}: expected a mapping, got {type(raw).__name__}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"entry {index}: 'name' is required")
    namespace = raw.get("namespace") or DEFAULT_NAMESPACE
    if not isinstance(namespace, str):
        raise ValueError(f"endpoint {name!r}: 'namespace' must be a string")
    address = raw.get("address")
    try:
        ip = ipaddress.ip_address(address) if isinstance(address, str) else None
    except ValueError:
        ip = None
    if not isinstance(ip, ipaddress.IPv4Address):
        raise ValueError(f"endpoint {name!r}: invalid IPv4 address {address!r}")
    port = raw.get("port")
    text = str(port) if isinstance(port, str | int) and not isinstance(port, bool) else ""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"endpoint {name!r}: invalid port {port!r}")
    labels = raw.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(k, str) for k in labels):
        raise ValueError(f"endpoint {name!r}: 'labels' must be a mapping of strings")
    labels = {k: str(v) for k, v in labels.items()}
    info = EndpointInfo(
        address=f"{ip}:{int(text)}",
        engine=labels.get(ENGINE_LABEL) or DEFAULT_ENGINE,
        labels=labels,
        pod_name=name,
    )
    return f"{namespace}/{name}", info


def parse_endpoints(data: bytes, source: str) -> tuple[list[EndpointInfo], list[str]]:
    """The file's endpoints and one line per skipped entry; ConfigError when the file as a whole is unusable."""
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{source}: the endpoints file exceeds the 1 MiB limit ({len(data)} bytes)")
    try:
        doc: Any = yaml.safe_load(data)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML or JSON ({str(exc).splitlines()[0]})") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{source}: expected a mapping with 'endpoints', got {type(doc).__name__}")
    unknown = set(doc) - {"endpoints"}
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))} (expected 'endpoints')")
    entries = doc.get("endpoints") or []
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: 'endpoints' must be a list")
    endpoints: list[EndpointInfo] = []
    problems: list[str] = []
    names: set[str] = set()
    addresses: set[str] = set()
    for i, raw in enumerate(entries):
        try:
            key, info = _entry(raw, i)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if key in names:
            problems.append(f"endpoint {key!r}: the name repeats an earlier entry")
            continue
        if info.address in addresses:
            problems.append(f"endpoint {key!r}: {info.address} repeats an earlier entry")
            continue
        names.add(key)
        addresses.add(info.address)
        endpoints.append(info)
    return endpoints, problems


def _identity(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)  # follows a symlink: a swapped ConfigMap link shows as a new inode
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class FileDiscovery:
    """Feeds the endpoint table from one file; `load()` once at start, then `run()` while watching."""

    def __init__(
        self,
        table: EndpointTable,
        path: str,
        watch: bool,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        assign: Callable[[list[EndpointInfo]], list[EndpointInfo]] | None = None,
    ) -> None:
        """`assign`: with several pools, the file's endpoints each given the pool whose selector matches its
        labels (those no pool selects are left out)."""
        self._table = table
        self._assign = assign
        self.path = path
        self.watch = watch
        self._poll_interval_s = poll_interval_s
        self._seen: tuple[int, int, int, int] | None = None
        self.loads = 0  # good loads so far
        self.last_error = ""

    def _read(self) -> tuple[list[EndpointInfo], list[str]]:
        try:
            data = Path(self.path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read the endpoints file ({exc.strerror or exc})") from None
        return parse_endpoints(data, self.path)

    def _apply(self, endpoints: list[EndpointInfo], problems: list[str]) -> None:
        for problem in problems:
            log.warning("%s: %s; entry skipped", self.path, problem)
        if self._assign is not None:
            endpoints = self._assign(endpoints)
        added, removed = self._table.replace_all(endpoints)
        self._table.synced = True
        self.loads += 1
        self.last_error = ""
        log.info("%s: %d endpoints (%d added, %d removed)", self.path, len(endpoints), added, removed)

    def load(self) -> None:
        """The first load, before the picker serves: a file that cannot be read or parsed is a ConfigError."""
        self._seen = _identity(self.path)
        self._apply(*self._read())

    async def reload(self) -> bool:
        """Read the file again; a broken file is logged and leaves the table as it is. True when it applied."""
        try:
            endpoints, problems = await asyncio.to_thread(self._read)
        except ConfigError as exc:
            self.last_error = str(exc)
            log.error("%s; keeping the %d endpoints of the last good load", exc, len(self._table))
            return False
        self._apply(endpoints, problems)
        return True

    async def run(self) -> None:
        """Poll the file for changes until cancelled (only with `watch`)."""
        if not self.watch:
            return
        while True:
            await asyncio.sleep(self._poll_interval_s)
            current = _identity(self.path)
            if current != self._seen:
                self._seen = current
                with contextlib.suppress(Exception):  # a reload never ends the watch
                    await self.reload()
