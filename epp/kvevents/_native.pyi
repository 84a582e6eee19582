# The compiled kernels (epp/kvevents/_native.c); epp.kvevents.kernels says when they run.
from array import array
from typing import Any, TypeAlias

from numpy.typing import NDArray

Buf: TypeAlias = bytes | bytearray | memoryview | array[Any] | NDArray[Any]  # C-contiguous, native order

ENABLED: int

def request_keys(
    tokens: Buf, width: int, n: int, k: Buf, c1: int, s1: int, s2: int, e: int, m: int, root: int, out: Buf
) -> None: ...
def prefix_blocks(
    keys: Buf, table_keys: Buf, table_masks: Buf, words: int, shift: int, bucket: int, max_probe: int, out: Buf
) -> int: ...
def prompt_hashes(data: Buf, words: int, n: int, k: Buf, shift: int, seed: int, out: Buf) -> None: ...
def prompt_hash_list(data: Buf, words: int, max_blocks: int, k: Buf, shift: int, seed: int) -> list[int]: ...
