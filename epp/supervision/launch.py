"""`python -m epp.supervision.launch <module> <pipe fd> <parent pid> <shared fds...>`: how the kit starts a child.

The child's module is imported under its own name (its message classes unpickle on both sides as the same
classes, which they would not as `__main__`) and its `child_main(end)` runs with the connected `ChildEnd`. The
parent's signals are ignored before anything else is imported, so a Ctrl-C during a child's start does not kill
it either.
"""

from __future__ import annotations

import signal
import sys


def main(argv: list[str]) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    import importlib

    from epp.supervision.child_end import ChildEnd

    end = ChildEnd.connect(argv[1:])
    code: int = importlib.import_module(argv[1]).child_main(end)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
