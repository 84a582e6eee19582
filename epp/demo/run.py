"""The demo itself: start the stack, drive the same traffic through the picker and through round robin, compare.

The two phases run one after the other on the same pool, with the same arrival times and the same customer
choices; only the text of the contexts differs (a per-phase salt), so neither phase finds the other's prompts in
the cache. Between phases the pool is left to drain, so the second phase starts on idle servers, as the first did.
"""

from __future__ import annotations

import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TextIO

from epp.demo.config import DemoConfig
from epp.demo.load import run_phase
from epp.demo.report import PhaseSummary, degradation_alarms, prefix_counters, side_by_side, summarise
from epp.demo.stack import Stack, stack, wait_idle
from epp.demo.traffic import shared_prefix_chat
from epp.sim.config import DEFAULT_MODEL


class _Stopped(KeyboardInterrupt):
    """SIGTERM, turned into the same clean unwinding as Ctrl-C."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stopped()


def _phase(stack_: Stack, name: str, url: str, config: DemoConfig, out: TextIO) -> PhaseSummary:
    shots = shared_prefix_chat(
        config.requests,
        config.rate,
        DEFAULT_MODEL,
        groups=config.groups,
        context_tokens=config.context_tokens,
        question_tokens=config.question_tokens,
        output_tokens=config.output_tokens,
        salt=name,
        seed=config.seed,
    )
    before = prefix_counters(stack_.addresses)
    outcomes, wall = run_phase(url, shots, config.phase_s, config.drain_s, name, out)
    after = prefix_counters(stack_.addresses)
    if not wait_idle(stack_.addresses, config.drain_s):
        print(f"note: the pool still had work {config.drain_s:.0f}s after the {name} phase", file=out)
    return summarise(name, outcomes, wall, [s.name for s in stack_.servers], before, after)


def run_demo(config: DemoConfig, out: TextIO = sys.stdout, progress: TextIO = sys.stderr) -> int:
    """Everything `epp demo` does; returns the exit code (0, or 130 when interrupted)."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    with tempfile.TemporaryDirectory(prefix="epp-demo-") as tmp:
        workdir = config.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)

        def say(line: str) -> None:
            print(line, file=out, flush=True)

        pids: Sequence[int] = ()
        try:
            with stack(workdir, config.profiles, config.speed, say) as stack_:
                pids = stack_.pids
                say(
                    f"traffic: {config.requests} streaming chat requests per listener at {config.rate:g}/s, "
                    f"{config.groups} customers x {config.context_tokens}-token contexts, "
                    f"{config.output_tokens} output tokens"
                )
                phases = [
                    _phase(stack_, "picker", stack_.picker_url, config, progress),
                    _phase(stack_, "round-robin", stack_.round_robin_url, config, progress),
                ]
                labels = {s.name: f"{s.name} ({s.profile.split('-')[0]})" for s in stack_.servers}
                alarms = degradation_alarms(stack_.metrics_address) if stack_.metrics_address else []
            say("")
            say(side_by_side(phases, labels))
            say(f"degradation alarms: {', '.join(alarms) if alarms else 'none'}")
            say(f"stopped pids {' '.join(str(p) for p in pids)}")
            return 0
        except KeyboardInterrupt:
            print("\ninterrupted: stopped everything the demo started", file=out, flush=True)
            if pids:
                print(f"stopped pids {' '.join(str(p) for p in pids)}", file=out, flush=True)
            return 130
        finally:
            signal.signal(signal.SIGTERM, previous)
