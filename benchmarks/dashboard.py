"""The Grafana dashboard rendered without Grafana: the demo's traffic, scraped by a real Prometheus, every panel's
queries asked of Prometheus's query_range API, drawn as a grid with matplotlib (docs/dashboard.png).

Grafana is not installable here, so this script is the dashboard's stand-in: it reads
manifests/dashboards/epp-grafana.json, fills in the variables as Grafana would (`$job` = all,
`$__rate_interval` = max(4 scrape intervals, step + 1 scrape interval)), and draws each panel's series with the
panel's legend format. The run is the demo's stack (`epp sim` servers, `epp serve` with its default serving
workers, Envoy from the production bootstrap) and the demo's shared-prefix chat traffic on the picker's listener.

    .venv/bin/python -m benchmarks.dashboard                     # 60 s of traffic -> docs/dashboard.png
    .venv/bin/python -m benchmarks.dashboard --seconds 20 --output /tmp/d.png

`observed_run` is also what tests/e2e/test_dashboard_data.py runs (shorter), so the picture and the test see the
same stack.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from epp.app.worker import METRICS_S
from epp.demo.load import run_phase
from epp.demo.stack import stack
from epp.demo.traffic import shared_prefix_chat
from epp.sim.config import DEFAULT_MODEL
from tests.support import dashboard
from tests.support.prometheus import Prometheus, prometheus, wait_scraped

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "dashboard.png"


@dataclass(frozen=True, slots=True)
class Traffic:
    seconds: float = 60.0
    rate: float = 8.0
    profiles: tuple[str, ...] = ("h100", "h100", "h100", "l4")
    groups: int = 16
    context_tokens: int = 2048
    output_tokens: int = 64
    drain_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Run:
    """A finished run's Prometheus (still running) and the wall-clock span the traffic covered."""

    server: Prometheus
    start: float
    end: float
    ok: int
    sent: int


@contextlib.contextmanager
def observed_run(
    workdir: Path,
    traffic: Traffic,
    interval_s: float = 1.0,
    rule_files: Sequence[Path] = (),
    progress: TextIO | None = None,
) -> Iterator[Run]:
    """The demo's stack scraped by Prometheus every `interval_s`, the traffic sent and drained; yields while every
    process still runs (Prometheus to be queried), then stops them all by PID."""
    with contextlib.ExitStack() as stop_all:
        running = stop_all.enter_context(stack(workdir, traffic.profiles, say=lambda _: None))
        server = stop_all.enter_context(
            prometheus(workdir / "prometheus", [running.metrics_address], interval_s, rule_files)
        )
        wait_scraped(server)
        shots = shared_prefix_chat(
            max(1, round(traffic.seconds * traffic.rate)),
            traffic.rate,
            DEFAULT_MODEL,
            groups=traffic.groups,
            context_tokens=traffic.context_tokens,
            output_tokens=traffic.output_tokens,
        )
        start = time.time()
        outcomes, _ = run_phase(running.picker_url, shots, traffic.seconds, traffic.drain_s, "dashboard", progress)
        # Serving workers send their series to the control process at most METRICS_S later; two scrapes
        # after that, every counter's last value is in Prometheus.
        time.sleep(METRICS_S + 3 * interval_s)
        yield Run(server, start, time.time(), sum(o.ok for o in outcomes), sum(o.sent for o in outcomes))


def rate_interval(step_s: float, interval_s: float) -> str:
    """Grafana's $__rate_interval: max(4 x scrape interval, step + scrape interval)."""
    return f"{max(4 * interval_s, step_s + interval_s):g}s"


def render(run: Run, output: Path, columns: int = 4) -> list[str]:
    """Every panel drawn from query_range over the run; returns the titles of panels that had no series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard.panels(dashboard.load())
    span = run.end - run.start
    step = max(1.0, span / 240)
    window = rate_interval(step, run.server.scrape_interval_s)
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.0 * columns, 2.9 * rows), squeeze=False)
    empty: list[str] = []
    for ax, panel in zip(axes.flat, panels, strict=False):
        drawn = 0
        for target in panel.targets:
            expr = dashboard.concrete(target.expr, window)
            for series in run.server.query_range(expr, run.start, run.end, step):
                xs = [float(t) - run.start for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot(xs, ys, linewidth=1.2, label=dashboard.legend(target.legend, series["metric"])[:40])
                drawn += 1
        ax.set_title(panel.title, fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if panel.unit:
            ax.set_ylabel(panel.unit, fontsize=7)
        if drawn == 0:
            empty.append(panel.title)
            ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes, color="red")
        elif drawn <= 8:
            ax.legend(fontsize=6, loc="upper left")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(
        f"epp dashboard (manifests/dashboards/epp-grafana.json) from Prometheus, {run.sent} demo requests over "
        f"{span:.0f}s (x: seconds since the first request)",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=80)
    plt.close(fig)
    return empty


def main(argv: Sequence[str] | None = None) -> int:
    default = Traffic()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=default.seconds, help="traffic to send (60s)")
    parser.add_argument("--rate", type=float, default=default.rate, help="requests per second (8)")
    parser.add_argument("--profiles", default=",".join(default.profiles), help="one simulated server per entry")
    parser.add_argument("--interval", type=float, default=1.0, help="Prometheus scrape interval, seconds (1)")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="the PNG to write (docs/dashboard.png)")
    args = parser.parse_args(argv)
    traffic = Traffic(seconds=args.seconds, rate=args.rate, profiles=tuple(args.profiles.split(",")))
    with (
        tempfile.TemporaryDirectory(prefix="epp-dashboard-") as tmp,
        observed_run(Path(tmp), traffic, args.interval) as run,
    ):
        empty = render(run, args.output)
    print(f"{run.ok}/{run.sent} requests answered 200; wrote {args.output}")
    if empty:
        print(f"panels with no series: {', '.join(empty)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
