"""A prompt's engine token ids as one little-endian uint32 buffer, the form the prefix producers read.

Why not a tuple of ints: a 4k-token prompt as a tuple costs ~140 KB of Python ints, and turning it into the
uint32 bytes the producers hash (`TokenizedPrompt.data`) is a per-element conversion on every pick (~85 µs at 4k
tokens, benchmarks/kv_events.py `pick`). The render client (`epp.director.tokens`) decodes the response's id list
straight into this buffer once; the token producer then publishes its bytes as they are and the precise producer
views them as an array. It is still a `Sequence[int]` (len, truth, indexing, iteration, equality with a tuple of the
same ids), so code that only counts or compares tokens does not care which form a request carries.
"""

from __future__ import annotations

import array
import sys
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np
import numpy.typing as npt

MAX_TOKEN_ID = (1 << 32) - 1
_U32 = "I" if array.array("I").itemsize == 4 else "L"


class TokenIds(Sequence[int]):
    """Immutable; `data` is `len(self)` little-endian uint32 values."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        if len(data) % 4:
            raise ValueError("token ids are 4 bytes each")
        self.data = data

    @classmethod
    def of(cls, ids: Sequence[int] | npt.NDArray[np.integer]) -> TokenIds:
        """From ints in 0..2^32-1 (OverflowError outside, TypeError for a non-integer)."""
        if isinstance(ids, TokenIds):
            return ids
        if isinstance(ids, np.ndarray):
            if ids.size and (ids.min() < 0 or ids.max() > MAX_TOKEN_ID):
                raise OverflowError("token id outside 0..2^32-1")
            return cls(ids.astype("<u4").tobytes())
        packed = array.array(_U32, ids)  # the fastest exact conversion of Python ints (range-checked by array)
        if sys.byteorder != "little":
            packed.byteswap()
        return cls(packed.tobytes())

    def array(self) -> npt.NDArray[np.uint32]:
        """A read-only uint32 view of the ids (no copy)."""
        return np.frombuffer(self.data, dtype="<u4")

    def __len__(self) -> int:
        return len(self.data) >> 2

    def __bool__(self) -> bool:
        return bool(self.data)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...
    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        if isinstance(index, slice):
            return tuple(self.array()[index].tolist())
        value: int = self.array()[index].item()
        return value

    def __iter__(self) -> Iterator[int]:
        return iter(self.array().tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return self.data == other.data
        if isinstance(other, tuple | list):
            return len(other) == len(self) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        return f"TokenIds({len(self)} ids)"
