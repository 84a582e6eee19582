"""Model rewrite: the name the client asked for → the model the endpoint is asked to serve.

Two sources, as upstream's director applies them: the `x-llm-d-model-name-rewrite` header (`x-gateway-…`) sets
the target first, then an InferenceModelRewrite rule for the model the client asked for (exact match → one of
weighted targets) overrides it. So the rule wins when both apply, and the header counts only for a model no rule
covers: the cluster's rewrite objects are the operator's word, the header a route's default.
A rewrite changes `body.model`; the director hands the re-serialised body to the protocol layer (which re-sends it
and fixes Content-Length) and keeps the client's name on the Decision so the response can be put back.
"""

from __future__ import annotations

import json
import random

from epp.datastore.objectives import ObjectiveStore, RewriteRule
from epp.requests import InferenceRequest


class ModelRewriter:
    def __init__(self, objectives: ObjectiveStore | None, seed: int | None = None) -> None:
        self._objectives = objectives
        self._rng = random.Random(seed)

    def target_of(self, request: InferenceRequest) -> str:
        """The rule for the client's model if there is one, else the header's model, else the client's."""
        objectives = self._objectives
        rule = objectives.rewrite_rule_for(request.model) if objectives is not None and request.model else None
        if rule is not None:
            return self._choose(rule)
        return request.model_rewrite or request.model

    def _choose(self, rule: RewriteRule) -> str:
        targets = rule.targets
        if not targets:
            return rule.source_model
        weights = [max(0, t.weight) for t in targets]
        total = sum(weights)
        if total <= 0:  # all weights zero: treat them as equal rather than refuse
            return targets[self._rng.randrange(len(targets))].model
        point = self._rng.random() * total
        for target, weight in zip(targets, weights, strict=True):
            point -= weight
            if point < 0:
                return target.model
        return targets[-1].model

    def rewrite(self, request: InferenceRequest) -> tuple[InferenceRequest, bytes | None]:
        """The request as the endpoint will see it, and the new body bytes (None when nothing changed)."""
        target = self.target_of(request)
        if target == request.model or request.body is None:
            return request, None
        body = dict(request.body)
        body["model"] = target
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return request._replace(model=target, body=body, body_size=len(data)), data
