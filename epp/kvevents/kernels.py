"""Which code computes a request's block keys, reads the shared table and hashes a prompt's blocks: compiled kernels
or numpy, chosen once.

The numpy code in `epp.kvevents.blockkeys` and `epp.kvevents.shared` is the definition (and, for the prefix-cache
scorer's block hashes, `epp.scheduling.hashing`); `_native` (a small C extension, epp/kvevents/_native.c, built at
install when a compiler is there) does the same steps in one call each, with every constant passed in from those
modules, because about 30 numpy calls on arrays this small were the floor of a pick (benchmarks/RESULTS.md,
kv_events and stream_path: both figures side by side). Property tests hold the two equal.

`NATIVE` is the extension when it was built and not switched off (`EPP_NATIVE=0` in the environment, read by the
extension when it is imported) on a little-endian machine (the table's layout is little-endian and the kernels read
it in native order), else None; `name()` says which runs ("native" or "numpy"), for the startup log and
/debug/pool. `BlockKeys`, `SharedBlockTable` and `BlockHasher` take `NATIVE` when they are built.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from epp.kvevents._native import Buf


class Kernels(Protocol):
    """The extension's functions (epp/kvevents/_native.pyi has them with their arguments' meaning)."""

    ENABLED: int

    def request_keys(
        self,
        tokens: Buf,
        width: int,
        n: int,
        k: Buf,
        c1: int,
        s1: int,
        s2: int,
        e: int,
        m: int,
        root: int,
        out: Buf,
    ) -> None: ...

    def prefix_blocks(
        self,
        keys: Buf,
        table_keys: Buf,
        table_masks: Buf,
        words: int,
        shift: int,
        bucket: int,
        max_probe: int,
        out: Buf,
    ) -> int: ...

    def prompt_hashes(self, data: Buf, words: int, n: int, k: Buf, shift: int, seed: int, out: Buf) -> None: ...

    def prompt_hash_list(self, data: Buf, words: int, max_blocks: int, k: Buf, shift: int, seed: int) -> list[int]: ...


_compiled: Kernels | None
try:
    from epp.kvevents import _native
except ImportError:  # built without a compiler: the numpy code runs
    _compiled = None
else:
    _compiled = _native

NATIVE: Kernels | None = None
if _compiled is not None and _compiled.ENABLED and sys.byteorder == "little":
    NATIVE = _compiled


def name() -> str:
    """What runs for the objects built now: "native" or "numpy"."""
    return "numpy" if NATIVE is None else "native"


def compiled() -> bool:
    """Whether the extension is installed (switched on or not)."""
    return _compiled is not None
