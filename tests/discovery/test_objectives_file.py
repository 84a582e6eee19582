"""`--objectives-file`: InferenceObjective / InferenceModelRewrite documents feed the same store as the watches.

Facts from the CRDs in tests/data/crds (gateway-api-inference-extension a70292c1 and llm-d-router ebab6879):
both kinds are v1alpha2 in the groups inference.networking.x-k8s.io and llm-d.ai; an objective's `spec.priority`
is an integer (default 0); a rewrite's `spec.rules[].matches[].model{type: Exact, value}` and
`targets[]{modelRewrite, weight}`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.datastore.objectives import ObjectiveStore
from epp.discovery.objectives_file import load_objectives
from epp.errors import ConfigError

FILE = """
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: critical}
spec: {priority: 10, poolRef: {name: pool}}
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: batch, namespace: team-a}
spec: {priority: -1, poolRef: {name: pool}}
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: critical}
spec: {priority: 3}
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceModelRewrite
metadata: {name: canary}
spec:
  poolRef: {name: pool}
  rules:
  - matches: [{model: {type: Exact, value: food-review}}]
    targets: [{modelRewrite: food-review-v2, weight: 90}, {modelRewrite: food-review-v3, weight: 10}]
"""


def test_objectives_and_rewrites_reach_the_store(tmp_path: Path) -> None:
    path = tmp_path / "objectives.yaml"
    path.write_text(FILE)
    store = ObjectiveStore()
    assert load_objectives(str(path), store) == (2, 1)
    assert store.priority_of("critical") == 3  # a name in both groups: the llm-d.ai one wins, as upstream's group
    assert store.priority_of("batch") == -1 and store.priority_of("other") == 0
    rule = store.rewrite_rule_for("food-review")
    assert rule is not None and [(t.model, t.weight) for t in rule.targets] == [
        ("food-review-v2", 90),
        ("food-review-v3", 10),
    ]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("kind: Pod\napiVersion: v1\nmetadata: {name: x}\n", "v1 Pod is not an InferenceObjective"),
        ("apiVersion: example.com/v1\nkind: InferenceObjective\nmetadata: {name: x}\n", "is not an InferenceObjective"),
        ("apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {}\n", "metadata.name is required"),
        (
            "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: x}\nspec: {priority: high}\n",
            "spec.priority must be an integer",
        ),
        ("a: [", "not valid YAML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_document(tmp_path: Path, text, words) -> None:
    path = tmp_path / "objectives.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_objectives(str(path), ObjectiveStore())
    assert str(err.value).startswith(f"--objectives-file {path}") and words in str(err.value)
