"""The simulator's tokenizer: deterministic token ids for a prompt text, the same in every process and run.

A token is CHARS_PER_TOKEN characters of the text (the last one may be shorter), its id the CRC-32 of their UTF-8
bytes modulo a Llama-3-sized vocabulary. Crude, but it is what the engine model already assumes (its prompt length
and its cached units are counted in the same 4-character tokens), so the token ids a KV event carries cover exactly
the text of the blocks the engine cached, and any client that tokenizes the same way finds the same blocks.
"""

from __future__ import annotations

import zlib

CHARS_PER_TOKEN = 4
VOCAB_SIZE = 128_256


def token_ids(text: str) -> list[int]:
    step = CHARS_PER_TOKEN
    return [
        zlib.crc32(text[i : i + step].encode("utf-8", "surrogatepass")) % VOCAB_SIZE for i in range(0, len(text), step)
    ]
