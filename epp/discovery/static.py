"""The cluster-free endpoint source: `--static-endpoints` and `--pool-file`."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import yaml

from epp.datastore import EndpointInfo
from epp.datastore.pool import PoolSpec, parse_pool
from epp.errors import ConfigError


def parse_static_endpoints(text: str, default_ports: tuple[int, ...] = ()) -> list[EndpointInfo]:
    """`ip:port,ip:port` (or bare `ip` when a pool file gives target ports: one endpoint per port).

    Addresses must be IP literals: Envoy's original-destination routing connects to exactly this address.
    An explicitly empty value is an empty pool (every request gets 503), e.g. while the backends are not up yet.
    """
    if not text.strip():
        return []
    endpoints: list[EndpointInfo] = []
    seen: set[str] = set()
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        host, sep, port_text = item.rpartition(":")
        if not sep or host.endswith(":") or (host.count(":") and not host.startswith("[")):
            # bare IPv4, or bare IPv6 without brackets
            host, port_text = item, ""
        host = host.strip("[]")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(f"--static-endpoints: {item!r} is not an IP address with a port (ip:port)") from None
        if port_text:
            if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise ConfigError(f"--static-endpoints: {item!r} has no valid port (1-65535)")
            ports: tuple[int, ...] = (int(port_text),)
        elif default_ports:
            ports = default_ports
        else:
            raise ConfigError(f"--static-endpoints: {item!r} needs a port (ip:port), or a --pool-file with targetPorts")
        for port in ports:
            address = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
            if address in seen:
                raise ConfigError(f"--static-endpoints: {address} is listed twice")
            seen.add(address)
            endpoints.append(EndpointInfo(address=address))
    if not endpoints:
        raise ConfigError(f"--static-endpoints: no endpoint in {text!r}")
    return endpoints


def load_pool_file(path: str) -> PoolSpec:
    """Read an InferencePool v1 YAML file (the first document that is an InferencePool, if several)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"--pool-file {path}: cannot read ({exc.strerror})") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ConfigError(f"--pool-file {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    pools = [d for d in documents if isinstance(d, dict) and d.get("kind") == "InferencePool"]
    if not pools:
        raise ConfigError(f"--pool-file {path}: no InferencePool object in the file")
    return parse_pool(pools[0], source=f"--pool-file {path}")
