"""The demo's traffic: shared-prefix chat, the workload where routing decides latency.

`groups` customers each hold a long system context (documents, a codebase) and ask short, unique questions about
it, arriving as a Poisson stream. A server that has a customer's context cached prefills only the question; any
other server prefills the whole context again. Round robin scatters every customer over every server; a picker
that scores prefix affinity keeps each customer where its context already is — until load says otherwise.

`salt` makes one phase's contexts differ from another's, so two phases run one after the other on the same pool
start from the same (cold) cache for their own prompts: the first phase cannot warm the second's.
"""

from __future__ import annotations

import json

import numpy as np

from epp.demo.load import Shot
from epp.sim.server import CHARS_PER_TOKEN

CHAT_PATH = "/v1/chat/completions"


def _text(word: str, tokens: int) -> str:
    chars = tokens * CHARS_PER_TOKEN
    return (word * (chars // len(word) + 1))[:chars]


def shared_prefix_chat(
    requests: int,
    rate: float,
    model: str,
    groups: int = 24,
    context_tokens: int = 4096,
    question_tokens: int = 128,
    output_tokens: int = 64,
    salt: str = "",
    seed: int = 0,
) -> list[Shot]:
    """`requests` streaming chat calls at a mean `rate` per second (Poisson gaps), each to one of `groups` contexts."""
    if requests <= 0 or rate <= 0 or groups <= 0:
        raise ValueError("requests, rate and groups must be positive")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, requests))
    arrivals -= arrivals[0]
    if requests > 1:  # Poisson gaps, stretched so the last request is sent at (requests - 1) / rate: all of them fit
        arrivals *= (requests - 1) / rate / arrivals[-1]
    picks = rng.integers(0, groups, requests)
    contexts = [_text(f"{salt}ctx{g:04d} ", context_tokens) for g in range(groups)]
    shots: list[Shot] = []
    for i in range(requests):
        body = {
            "model": model,
            "stream": True,
            "max_tokens": output_tokens,
            "messages": [
                {"role": "system", "content": contexts[int(picks[i])]},
                {"role": "user", "content": _text(f"{salt}q{i:06d} ", question_tokens)},
            ],
        }
        shots.append(Shot(float(arrivals[i]), CHAT_PATH, json.dumps(body).encode()))
    return shots
