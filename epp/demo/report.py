"""What a phase measured, and the side-by-side table the demo prints.

Latencies come from the client (what a user sees through the gateway); who served each request comes from the
simulator's own header, and the prefix-cache hit rate from the simulators' own counters read before and after —
none of it is taken from the router under test.
"""

from __future__ import annotations

import math
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from epp.demo.load import Outcome

PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"


def prefix_counters(addresses: Sequence[str], timeout_s: float = 5.0) -> tuple[float, float]:
    """(queried tokens, hit tokens) summed over the servers' /metrics pages."""
    queries = hits = 0.0
    for address in addresses:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as response:
            page = response.read().decode()
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name == PREFIX_QUERIES:
                    queries += sample.value
                elif sample.name == PREFIX_HITS:
                    hits += sample.value
    return queries, hits


def degradation_alarms(metrics_address: str, timeout_s: float = 5.0) -> list[str]:
    """The picker's degradation alarms up now (`plugin reason` each), from its /metrics: what a healthy run must not
    raise (docs/observability.md, "Degradation alarms")."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=timeout_s) as response:
        page = response.read().decode()
    return [
        f"{sample.labels.get('plugin', '')} {sample.labels.get('reason', '')}"
        for family in text_string_to_metric_families(page)
        if family.name == "llm_d_epp_degraded"
        for sample in family.samples
        if sample.value >= 1.0
    ]


@dataclass(frozen=True, slots=True)
class PhaseSummary:
    name: str
    planned: int
    ok: int
    failed: int  # answered with an error status or no answer
    unfinished: int  # cancelled at the drain deadline
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    e2e_p50: float
    e2e_p99: float
    throughput: float  # completed requests per wall second of the phase
    per_server: dict[str, int]
    hit_rate: float  # NaN when no prompt tokens were queried


def _pct(values: np.ndarray, q: float) -> float:
    """Percentile where NaN (no answer by the deadline) counts as the slowest: +inf, shown as "timeout"."""
    if not values.size:
        return math.nan
    return float(np.percentile(np.where(np.isnan(values), np.inf, values), q, method="higher"))


def summarise(
    name: str,
    outcomes: Sequence[Outcome],
    wall_s: float,
    servers: Sequence[str],
    before: tuple[float, float],
    after: tuple[float, float],
) -> PhaseSummary:
    sent = [o for o in outcomes if o.sent]
    ok = [o for o in sent if o.ok]
    # Latency over every request sent, not only the answered ones: leaving out the requests that failed or did
    # not finish would flatter exactly the router that overloads a server. A missing value counts as +inf; an
    # error answer counts as no first token at all (a quick 503 is not a fast response).
    ttft = np.array([o.ttft if o.ok or o.status < 0 else math.nan for o in sent], dtype=np.float64)
    e2e = np.array([o.e2e if o.ok else math.nan for o in sent], dtype=np.float64)
    counts = Counter(o.server for o in ok)
    queried = after[0] - before[0]
    return PhaseSummary(
        name=name,
        planned=len(sent),
        ok=len(ok),
        failed=sum(1 for o in sent if o.status >= 0 and not o.ok),
        unfinished=sum(1 for o in sent if o.status < 0),
        ttft_p50=_pct(ttft, 50),
        ttft_p90=_pct(ttft, 90),
        ttft_p99=_pct(ttft, 99),
        e2e_p50=_pct(e2e, 50),
        e2e_p99=_pct(e2e, 99),
        throughput=len(ok) / wall_s if wall_s > 0 else math.nan,
        per_server={s: counts.get(s, 0) for s in servers},
        hit_rate=(after[1] - before[1]) / queried if queried > 0 else math.nan,
    )


def _ms(seconds: float) -> str:
    if math.isinf(seconds):
        return "timeout"
    return "n/a" if math.isnan(seconds) else f"{seconds * 1e3:.0f} ms"


def side_by_side(phases: Sequence[PhaseSummary], labels: dict[str, str] | None = None) -> str:
    """A plain-text table, one column per phase; `labels` names servers (e.g. with their GPU profile)."""
    labels = labels or {}
    rows: list[tuple[str, list[str]]] = [
        ("requests ok / sent", [f"{p.ok} / {p.planned}" for p in phases]),
        ("failed, unfinished", [f"{p.failed}, {p.unfinished}" for p in phases]),
        ("TTFT p50", [_ms(p.ttft_p50) for p in phases]),
        ("TTFT p90", [_ms(p.ttft_p90) for p in phases]),
        ("end-to-end p50", [_ms(p.e2e_p50) for p in phases]),
        ("end-to-end p99", [_ms(p.e2e_p99) for p in phases]),
        ("prefix-cache hit rate", ["n/a" if math.isnan(p.hit_rate) else f"{p.hit_rate:.0%}" for p in phases]),
    ]
    servers = list(phases[0].per_server) if phases else []
    for server in servers:
        rows.append((f"requests on {labels.get(server, server)}", [str(p.per_server.get(server, 0)) for p in phases]))
    first = max(len(r[0]) for r in rows)
    widths = [max(len(p.name), *(len(r[1][i]) for r in rows)) for i, p in enumerate(phases)]
    lines = ["  ".join([" " * first, *(p.name.rjust(w) for p, w in zip(phases, widths, strict=True))])]
    lines.append("  ".join(["-" * first, *("-" * w for w in widths)]))
    for title, cells in rows:
        lines.append("  ".join([title.ljust(first), *(c.rjust(w) for c, w in zip(cells, widths, strict=True))]))
    return "\n".join(lines)
