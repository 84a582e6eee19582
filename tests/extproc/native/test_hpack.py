"""HPACK decoding in C (epp/extproc/native/hpack.c) against RFC 7541's own examples (Appendix C), with and without
Huffman coding, the dynamic table carried from block to block; malformed blocks are errors, not crashes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

_h2 = pytest.importorskip("epp.extproc.native._h2")

# RFC 7541 C.3 and C.4: the same three requests, literals then Huffman-coded; each block indexes what it adds.
REQUESTS = [
    [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com")],
    [
        (b":method", b"GET"),
        (b":scheme", b"http"),
        (b":path", b"/"),
        (b":authority", b"www.example.com"),
        (b"cache-control", b"no-cache"),
    ],
    [
        (b":method", b"GET"),
        (b":scheme", b"https"),
        (b":path", b"/index.html"),
        (b":authority", b"www.example.com"),
        (b"custom-key", b"custom-value"),
    ],
]
C3 = [
    "828684410f7777772e6578616d706c652e636f6d",
    "828684be58086e6f2d6361636865",
    "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
]
C4 = [
    "828684418cf1e3c2e5f23a6ba0ab90f4ff",
    "828684be5886a8eb10649cbf",
    "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
]


@pytest.mark.parametrize("blocks", [C3, C4], ids=["literal", "huffman"])
def test_rfc_examples_decode_with_the_dynamic_table_carried_over(blocks: list[str]) -> None:
    assert _h2.decode_blocks([bytes.fromhex(b) for b in blocks]) == REQUESTS


def test_huffman_decodes_the_rfc_strings() -> None:
    assert _h2.huffman_decode(bytes.fromhex("f1e3c2e5f23a6ba0ab90f4ff")) == b"www.example.com"
    assert _h2.huffman_decode(bytes.fromhex("a8eb10649cbf")) == b"no-cache"
    assert _h2.huffman_decode(b"") == b""


@pytest.mark.parametrize(
    "data",
    [
        "ff",  # padding longer than 7 bits... of zeros would decode; a lone 0xff is an incomplete long code
        "f1e3c2e5f23a6ba0ab90f4fe",  # padding not all ones
        "ffffffff",  # 32 one bits: contains EOS
    ],
)
def test_malformed_huffman_is_refused(data: str) -> None:
    with pytest.raises(ValueError):
        _h2.huffman_decode(bytes.fromhex(data))


@pytest.mark.parametrize(
    "block",
    [
        "be",  # index 62: the dynamic table is empty
        "80",  # index 0
        "41",  # literal with an indexed name and no value byte
        "400a6375",  # a name longer than the block
        "3fe21f",  # a table size update to 4097, above the advertised 4096
        "8220",  # a size update after a field
        "ffffffffffff7f",  # an integer of more than 32 bits
    ],
)
def test_malformed_blocks_are_compression_errors(block: str) -> None:
    with pytest.raises(ValueError):
        _h2.decode_blocks([bytes.fromhex(block)])


def test_a_size_update_evicts_and_entries_larger_than_the_table_are_not_kept() -> None:
    add = bytes.fromhex("400a637573746f6d2d6b65790c637573746f6d2d76616c7565")  # custom-key: custom-value (54 B)
    assert _h2.decode_blocks([add, bytes.fromhex("be")]) == [[(b"custom-key", b"custom-value")]] * 2
    with pytest.raises(ValueError):  # size 0 empties the table: index 62 is gone
        _h2.decode_blocks([add, bytes.fromhex("20be")])
    with pytest.raises(ValueError):  # a 32-byte table cannot hold a 54-byte entry
        _h2.decode_blocks([bytes.fromhex("3f01") + add, bytes.fromhex("be")])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=4))
def test_random_blocks_decode_or_fail_cleanly(blocks: list[bytes]) -> None:
    try:
        _h2.decode_blocks(blocks)
    except ValueError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_huffman_strings_decode_or_fail_cleanly(data: bytes) -> None:
    try:
        _h2.huffman_decode(data)
    except ValueError:
        pass
