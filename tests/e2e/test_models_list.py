"""`GET /v1/models` answered by the picker (--serve-models-list) through a real Envoy, read with the openai SDK's
`client.models.list()`: the pool's InferenceObjectives and the models its InferenceModelRewrites match and send
to, in OpenAI's shape; the endpoints are never asked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.conftest import Backends, start_picker
from tests.support.envoy import envoy
from tests.support.procs import http_ok, running, wait_until

pytestmark = pytest.mark.e2e

OBJECTIVES = """
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: interactive}
spec: {priority: 10, poolRef: {name: pool}}
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceModelRewrite
metadata: {name: food-review}
spec:
  poolRef: {name: pool}
  rules:
    - matches: [{model: {value: food-review}}]
      targets: [{modelRewrite: food-review-v2, weight: 1}]
"""


@pytest.fixture(scope="module")
def models_gateway(e2e_tmp: Path, backends: Backends, envoy_available: None) -> Iterator[str]:
    objectives = e2e_tmp / "models-objectives.yaml"
    objectives.write_text(OBJECTIVES)
    argv, picker = start_picker(
        e2e_tmp, ",".join(backends.pool), "--objectives-file", str(objectives), "--serve-models-list"
    )
    with running(argv, e2e_tmp / "picker-models.log") as proc:
        wait_until(lambda: http_ok(picker.url("/readyz")), 60, "epp serve", proc)
        with envoy(e2e_tmp, picker.grpc_port, "FULL_DUPLEX_STREAMED") as port:
            yield f"http://127.0.0.1:{port}"


def test_the_openai_sdk_lists_the_pools_models_from_the_picker(models_gateway: str) -> None:
    client = openai.OpenAI(base_url=models_gateway + "/v1", api_key="unused", max_retries=0, timeout=10.0)
    models = list(client.models.list())
    assert sorted(m.id for m in models) == ["food-review", "food-review-v2", "interactive"]
    assert {m.object for m in models} == {"model"}
    assert {m.owned_by for m in models} == {"epp"}
    client.close()
