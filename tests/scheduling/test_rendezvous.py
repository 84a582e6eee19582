"""rendezvous-picker: replicas that share nothing agree on where a shared prefix goes, and a burst they split
does not herd."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from epp.config.decode import parse_config
from epp.datastore.table import EndpointTable
from epp.scheduling import build_scheduler
from epp.scheduling.profile import ProfileScheduler
from tests.scheduling.tables import NOW, request, table_with

CONFIG = Path(__file__).resolve().parents[2] / "manifests" / "active-active" / "configmap.yaml"


def replica(seed: int) -> tuple[ProfileScheduler, EndpointTable]:
    import yaml

    text = yaml.safe_load(CONFIG.read_text())["data"]["active-active.yaml"]  # the ConfigMap's profile
    config = parse_config(yaml.safe_load(text), str(CONFIG))
    table = table_with([dict(waiting=w, running=4, kv_usage=0.3) for w in (0, 1, 1, 2, 2, 3, 3, 3)])
    return build_scheduler(config, seed=seed), table


def pick(scheduler: ProfileScheduler, table: EndpointTable, prompt: str) -> int:
    snap = table.snapshot()
    slot = scheduler.handler.pick(snap, snap.slots, request(prompt), NOW)[0]
    table.book_pick(slot)
    return slot


def test_requests_sharing_a_prefix_land_together_whichever_replica_picks() -> None:
    replicas = [replica(seed) for seed in (1, 2)]
    chooser = random.Random(7)
    first: dict[int, int] = {}
    same = total = 0
    for i in range(400):
        group = chooser.randrange(40)
        prompt = f"system prompt {group}: " + "you are a helpful assistant. " * 12 + f"question {i}"
        scheduler, table = replicas[chooser.randrange(2)]  # which replica the gateway happened to ask
        slot = pick(scheduler, table, prompt)
        if group in first:
            total += 1
            same += slot == first[group]
        else:
            first[group] = slot
        if i % 50 == 49:  # a scrape: every replica's own picks are folded into the pages
            for _, t in replicas:
                t.column("picks_since_scrape")[:] = 0
                t.column("inflight")[:] = 0
    assert same / total >= 0.9, (same, total)


def test_a_burst_split_over_replicas_spreads_as_one_replica_would() -> None:
    distinct = [f"request {i}: " + "lorem ipsum " * 30 for i in range(100)]
    for replicas in (1, 2, 4):
        pickers = [replica(seed) for seed in range(replicas)]
        counts: Counter[int] = Counter(pick(*pickers[i % replicas], prompt) for i, prompt in enumerate(distinct))
        assert len(counts) == 8, (replicas, counts)
        assert counts.most_common(1)[0][1] <= 20, (replicas, counts)  # the one-replica bound of test_profile
