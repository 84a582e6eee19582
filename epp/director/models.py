"""`GET /v1/models` answered by the picker (--serve-models-list): the model names a client may send to the pools
it serves, in OpenAI's list shape.

Upstream's picker does not answer it (the request goes to an endpoint of the pool, which lists only its own base
model and loaded adapters), so this is off by default. When on, the names are what the picker itself routes on:
the pool's InferenceObjectives, the models its InferenceModelRewrites match and send to, and the LoRA adapters its
endpoints report running or waiting (scraped). With several pools, a stream of one pool lists that pool's names;
the aggregate (a stream that names no pool, e.g. a route for `/v1/models` alone) lists the union, each name owned
by the first pool (by key) that has it. Built per request from the current state: the request is rare and the
names change at run time. Pure: reads the stores it is given, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from epp.datastore.objectives import ObjectiveStore
from epp.datastore.table import EndpointTable
from epp.director.decision import Answer
from epp.requests import InferenceRequest

MODELS_PATH = "/v1/models"

# (pool key, its objectives, whether the table's endpoints are filtered by that key): the pools a list covers.
PoolSource = tuple[str, ObjectiveStore, bool]


def is_models_request(request: InferenceRequest) -> bool:
    """A `GET /v1/models` without a body (query and trailing slash aside)."""
    headers = request.headers
    if headers.get(":method", "GET") != "GET":
        return False
    path = headers.get(":path", "").split("?", 1)[0].rstrip("/")
    return path == MODELS_PATH


def names_of(table: EndpointTable, objectives: ObjectiveStore, pool: str | None) -> set[str]:
    """The model names a client may send to one pool (`pool` None: every endpoint of the table)."""
    names = set(objectives.objectives())
    names.update(objectives.configured_models())
    view = table.view()
    for slot in view.slots.tolist():
        info = view.infos[slot]
        if info is None or (pool is not None and info.pool != pool):
            continue
        names.update(view.running_adapters[slot])
        names.update(view.waiting_adapters[slot])
    names.discard("")
    return names


class ModelsList:
    """The answer to `GET /v1/models` over the pools `sources()` gives (one pool, or every pool for the
    aggregate); `answer` is the pipeline's answer stage (`DecisionPipeline.answering`)."""

    __slots__ = ("_sources", "_table")

    def __init__(self, table: EndpointTable, sources: Callable[[], Iterable[PoolSource]]) -> None:
        self._table = table
        self._sources = sources

    def body(self) -> bytes:
        owner: dict[str, str] = {}
        for key, objectives, filtered in self._sources():
            for name in names_of(self._table, objectives, key if filtered else None):
                owner.setdefault(name, key)
        # OpenAI's shape; `created` 0: the picker does not know when a model was made (clients read an integer).
        data = [{"id": name, "object": "model", "created": 0, "owned_by": owner[name]} for name in sorted(owner)]
        return json.dumps({"object": "list", "data": data}, separators=(",", ":")).encode()

    def answer(self, request: InferenceRequest) -> Answer | None:
        if not is_models_request(request):
            return None
        return Answer(self.body())
