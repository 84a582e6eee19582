"""Model rewrite: the name the client asked for → the model the endpoint is asked to serve.

Two sources, in this order: the `x-gateway-model-name-rewrite` header (an explicit instruction from the gateway
route, so it wins) and InferenceModelRewrite rules (exact match on the requested model → one of weighted targets).
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
        if request.model_rewrite:
            return request.model_rewrite
        if self._objectives is None or not request.model:
            return request.model
        rule = self._objectives.rewrite_rule_for(request.model)
        return self._choose(rule) if rule is not None else request.model

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
