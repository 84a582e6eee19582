"""Fixtures for the Kubernetes feeders: a fake API server on loopback and a real client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from epp.discovery.kubernetes.rest import KubeRest, load_api_client
from tests.fakes.apiserver import FakeApiServer


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def kubeconfig(apiserver: FakeApiServer, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def rest(kubeconfig: Path) -> Iterator[KubeRest]:
    client = load_api_client(str(kubeconfig))
    yield KubeRest(client)
    client.close()
