"""Restarting a child process that died: the backoff, and the words for how it ended.

One policy for every child the picker supervises (epp.supervision.child): the first restart
comes quickly (a killed child is back within a second), each further one waits twice as long up to a ceiling,
with ±20 % jitter so that children which died together do not restart together, and a child that ran
`stable_s` resets the delay.
"""

from __future__ import annotations

import random
import signal

RESTART_INITIAL_S = 0.2
RESTART_MAX_S = 30.0
STABLE_S = 30.0


class RestartBackoff:
    """The delay before the next restart of one child."""

    def __init__(
        self, initial_s: float = RESTART_INITIAL_S, max_s: float = RESTART_MAX_S, stable_s: float = STABLE_S
    ) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.stable_s = stable_s
        self.delay = initial_s

    def died_after(self, ran_s: float) -> None:
        """A child ended after running `ran_s`: one that ran long enough starts the backoff again."""
        if ran_s >= self.stable_s:
            self.delay = self.initial_s

    def next_delay(self) -> float:
        """The delay for this restart (jittered); the next one doubles, up to the ceiling."""
        delay = self.delay * random.uniform(0.8, 1.2)
        self.delay = min(self.max_s, self.delay * 2)
        return delay


def describe_exit(code: int) -> str:
    """`Popen.returncode` in words: "exit code 1", "killed by SIGKILL"."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"
