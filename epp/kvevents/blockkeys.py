"""Block keys from token ids: a chain hash whose next key depends only on the previous key and the block's tokens.

Why a hasher of its own rather than `epp.scheduling.hashing.BlockHasher`: that one hashes prompt *text* with a
multiplier per absolute word position, so a key can only be computed from the start of the prompt. KV events start
mid-chain: a `BlockStored` names its parent block and carries only the new blocks' tokens. Here a key is a function
of (parent key, this block's tokens) alone, so an event's keys follow from its parent's key, and a request's keys
from the root, with the same values. The engine's own hashes are never reused (they depend on the engine's hash
algorithm and its PYTHONHASHSEED); as upstream does, keys are recomputed from `token_ids`, so our block size and
seed need not match the engine's.

Definition, all arithmetic mod 2^64 (numpy uint64 wraps):

    y_i   = mix(Σ_t tokens[i·B + t] · K_t)      K_t: B fixed odd multipliers; mix: x ^= x >> 30; x ·= C1; x ^= x >> 27
    v_i   = E · y_i                              E = 2 · C2: even
    key_i = key_{i-1} · M + v_i                 key_{-1} = root(seed, LoRA name), odd; M odd

`mix` is the first three steps of the splitmix64 finalizer; its last multiply is E, outside it, so that a request
folds it into its per-position multipliers (below), and its last xorshift is left out: every key goes through
multiplications by odd M powers, which carry each bit of y upwards anyway. E is even, so every v_i is even and,
the root being odd, **every key is odd**: 0 is never a key (the shared-memory table uses 0 as its empty marker and
stores keys as they are, `epp.kvevents.shared`). The price is one bit: y and y + 2^63 give the same v, a 2^-63
collision per pair of blocks, as for any 63-bit key.

One recurrence, two ways to evaluate it: an event walks it block by block (`chain`, a few Python operations per
block, after one vectorised `block_values` call for the whole batch), a request evaluates it in closed form,
key_i = M^(i+1) · (root + Σ_{j≤i} y_j · E · M^-(j+1)), with one cumulative sum (`request_keys`). Tests hold the two
equal. Where the compiled kernels are built (`epp.kvevents.kernels`), `request_keys` walks the recurrence in C
instead, in one call, these constants passed in. Keys are 64-bit (63 bits of entropy): two different prefixes share
a key with probability about 2^-63 per pair, as for upstream's FNV-64a; they never leave the process except to the
shared-memory reader, which uses the same code.
"""

from __future__ import annotations

import array
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from epp.kvevents import kernels
from epp.kvevents.token_ids import TokenIds

if TYPE_CHECKING:
    from epp.kvevents._native import Buf

U64Array = npt.NDArray[np.uint64]
MASK = (1 << 64) - 1
M = 0x9E3779B97F4A7C15  # odd: invertible mod 2^64
_M_INV = pow(M, -1, 1 << 64)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_S30, _S27 = np.uint64(30), np.uint64(27)
_E = np.uint64((2 * 0x94D049BB133111EB) & MASK)  # even: every v_i even, every key odd
MAX_BLOCK_SIZE = 4096
# the same constants as ints, for the compiled kernel (`kernels.NATIVE`): one definition
_NATIVE_MIX = (int(_C1), int(_S30), int(_S27), int(_E), M)


def _mix(x: U64Array) -> U64Array:
    """y from a block's sum, in place (x is a fresh array)."""
    t = x >> _S30
    x ^= t
    x *= _C1
    np.right_shift(x, _S27, out=t)
    x ^= t
    return x


def _powers(base: int, n: int) -> U64Array:
    """base^1 .. base^n mod 2^64 (uint64 products wrap)."""
    return np.multiply.accumulate(np.full(n, base, dtype=np.uint64))


class BlockKeys:
    """The key function for one block size and seed; `max_blocks` bounds a request's key count (and the tables)."""

    def __init__(self, block_size: int = 16, seed: str = "", max_blocks: int = 8192) -> None:
        if not 1 <= block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block size must be in 1..{MAX_BLOCK_SIZE}, got {block_size}")
        if max_blocks < 1:
            raise ValueError("max_blocks must be positive")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self._seed = seed
        rng = np.random.default_rng(0x6B76_6576)  # fixed forever: keys must agree across processes and runs
        k = (rng.integers(0, 2**63, size=block_size, dtype=np.uint64) << np.uint64(1)) | np.uint64(1)
        self._kt = np.tile(k, max_blocks)  # K_t repeated per block: one multiply over the whole token run
        self._k = k
        self._p = _powers(M, max_blocks)  # M^(i+1)
        self._eq = _powers(_M_INV, max_blocks) * _E  # E · M^-(i+1): v's factor E folded in
        self._roots: dict[str, int] = {}
        self._native = kernels.NATIVE  # the compiled recurrence, or None: the numpy closed form below

    def root(self, lora_name: str | None = None) -> int:
        """The key before block 0: from the seed and the LoRA adapter (its blocks are not the base model's)."""
        name = lora_name or ""
        r = self._roots.get(name)
        if r is None:
            if len(self._roots) > 4096:  # adapter names come from events and requests: bound the cache
                self._roots.clear()
            digest = hashlib.blake2b(f"{self._seed}\0{name}".encode("utf-8", "surrogatepass"), digest_size=8)
            r = int.from_bytes(digest.digest(), "little") | 1  # odd: with every v_i even, every key is odd
            self._roots[name] = r
        return r

    @staticmethod
    def tokens_array(token_ids: Sequence[int] | U64Array) -> U64Array:
        """Token ids as uint64 without a per-element numpy conversion (array.array is ~2.5x faster on a list);
        OverflowError for an id outside 0..2^64-1, TypeError for a non-integer. A uint64 array passes as is (a
        tokenizer client that parses its JSON straight into numpy skips the list entirely)."""
        if isinstance(token_ids, np.ndarray):
            return token_ids.astype(np.uint64, copy=False)
        if isinstance(token_ids, TokenIds):  # the render client's uint32 buffer: one vectorised widening
            return token_ids.array().astype(np.uint64)
        return np.frombuffer(array.array("Q", token_ids), dtype=np.uint64)

    def _mixed(self, tokens: U64Array, n: int) -> U64Array:
        """y_i of the first n blocks (a fresh array)."""
        b = self.block_size
        # Σ_t tokens[i·B + t]·K_t for every block at once: an integer matmul wraps mod 2^64 as the ufuncs do (the
        # same sums as a multiply and `reduceat`, ~1.6× faster at 4k tokens)
        x: U64Array = tokens[: n * b].reshape(n, b) @ self._k
        return _mix(x)

    def _values(self, tokens: U64Array, n: int) -> U64Array:
        v = self._mixed(tokens, n)
        v *= _E
        return v

    def block_values(self, tokens: U64Array) -> list[int]:
        """v_i for every whole block of `tokens`; a trailing partial block is ignored."""
        b, cap = self.block_size, self.max_blocks
        n = len(tokens) // b
        out: list[int] = []
        for start in range(0, n, cap):
            m = min(cap, n - start)
            out.extend(self._values(tokens[start * b :], m).tolist())
        return out

    def unit_sums(self, tokens: U64Array, offset: int, unit: int) -> list[int]:
        """The pre-mix sums Σ tokens[t]·K_t of each run of `unit` tokens, the first run starting at position `offset`
        of one of our blocks (`unit` divides the block size). An engine block smaller than ours is such a run: the
        sums of the runs that make up block i add up to the sum that `mix` turns into v_i, so an event that stops
        inside one of our blocks leaves (offset, sum so far) for its successor to continue (`mix_sums`)."""
        b = self.block_size
        n = len(tokens) // unit
        if n == 0:
            return []
        tokens = tokens[: n * unit]
        if offset + len(tokens) <= len(self._kt):
            kt = self._kt[offset : offset + len(tokens)]
        else:  # longer than the precomputed run: the same multipliers by position within the block
            kt = self._kt[(offset + np.arange(len(tokens))) % b]
        sums: list[int] = np.add.reduceat(tokens * kt, np.arange(0, n * unit, unit)).tolist()
        return sums

    @staticmethod
    def mix_sums(sums: Sequence[int]) -> list[int]:
        """v_i from whole blocks' pre-mix sums (what `unit_sums` adds up)."""
        v = _mix(np.array(sums, dtype=np.uint64))
        v *= _E
        out: list[int] = v.tolist()
        return out

    @staticmethod
    def chain(parent: int, values: Sequence[int]) -> list[int]:
        """The keys that follow `parent`, one per block value (the recurrence, block by block)."""
        out = []
        k = parent
        for v in values:
            k = (k * M + v) & MASK
            out.append(k)
        return out

    def request_keys(self, token_ids: Sequence[int] | U64Array, lora_name: str | None = None) -> U64Array:
        """The keys of a request's whole blocks from the root (at most `max_blocks`), in closed form."""
        b = self.block_size
        n = min(len(token_ids) // b, self.max_blocks)
        if n == 0:
            return np.zeros(0, dtype=np.uint64)
        if len(token_ids) >= (n + 1) * b:  # longer than the cap: convert only what is hashed
            token_ids = token_ids[: n * b]
        if self._native is not None:
            return self._native_keys(token_ids, n, lora_name)
        tokens = token_ids if isinstance(token_ids, np.ndarray) and token_ids.dtype == np.uint64 else None
        y = self._mixed(self.tokens_array(token_ids) if tokens is None else tokens, n)
        y *= self._eq[:n]
        np.add.accumulate(y, out=y)
        y += np.uint64(self.root(lora_name))
        y *= self._p[:n]
        return y

    def _native_keys(self, token_ids: Sequence[int] | U64Array, n: int, lora_name: str | None) -> U64Array:
        """`request_keys` by the compiled recurrence (one call, block by block, as `chain` walks it), straight from
        uint32 or uint64 ids: the render client's buffer and native-order unsigned arrays are read as they are."""
        assert self._native is not None
        data: Buf
        if isinstance(token_ids, TokenIds):
            data, width = token_ids.data, 4
        elif isinstance(token_ids, np.ndarray):
            dtype = token_ids.dtype
            if dtype.kind == "u" and dtype.itemsize in (4, 8) and dtype.isnative and token_ids.flags.c_contiguous:
                data, width = token_ids, dtype.itemsize
            else:
                data, width = np.ascontiguousarray(self.tokens_array(token_ids)), 8
        else:
            data, width = array.array("Q", token_ids), 8  # OverflowError / TypeError as `tokens_array`
        keys = np.empty(n, dtype=np.uint64)
        c1, s1, s2, e, m = _NATIVE_MIX
        self._native.request_keys(data, width, n, self._k, c1, s1, s2, e, m, self.root(lora_name), keys)
        return keys
