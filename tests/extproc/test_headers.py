"""The compiled header-map reader (epp/extproc/_headers.c) equals its definition (`headers_to_dict_upb`): the same
dict, in the same order, on random maps; where it does not read a map (a value that is not UTF-8), the definition
answers."""

import pytest
from envoy.config.core.v3 import base_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.extproc import messages

needs_native = pytest.mark.skipif(messages._COMPILED is None, reason="the C extension is not built (or EPP_NATIVE=0)")

name = st.one_of(st.sampled_from([":path", ":authority", "x-request-id", "content-type", "", "a"]), st.text(max_size=8))
raw = st.one_of(
    st.sampled_from([b"", b"x", b"\xff", b"ok \xc3\xa9", b"\xc3", b"\x00"]),
    st.binary(max_size=12),
    st.text().map(str.encode),
)
value = st.one_of(st.sampled_from(["", "old", "é"]), st.text(max_size=8))
header_maps = st.lists(st.tuples(name, raw, value), max_size=14)


def _map(entries: list[tuple[str, bytes, str]]) -> base_pb2.HeaderMap:
    header_map = base_pb2.HeaderMap()
    for key, raw_value, text in entries:
        header = header_map.headers.add()
        header.key = key
        header.raw_value = raw_value
        header.value = text
    return header_map


@needs_native
@settings(max_examples=500, deadline=None)
@given(header_maps)
def test_the_compiled_reader_is_the_definition(entries: list[tuple[str, bytes, str]]) -> None:
    header_map = _map(entries)
    expected = messages.headers_to_dict_upb(header_map)
    assert messages._COMPILED is not None
    got = messages._COMPILED.header_dict(header_map.SerializeToString())
    if got is None:  # not read there: only a value that is not UTF-8, which the definition reads with replacements
        assert any(_bad(r) for _, r, _ in entries)
    else:
        assert list(got.items()) == list(expected.items())
    assert list(messages.headers_to_dict(header_map).items()) == list(expected.items())


def _bad(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return True
    return False


@needs_native
def test_a_field_the_reader_does_not_know_leaves_the_map_to_the_definition() -> None:
    header_map = _map([("a", b"1", "")])
    data = header_map.SerializeToString() + b"\x10\x01"  # field 2, a varint: not a HeaderMap field
    assert messages._COMPILED is not None
    assert messages._COMPILED.header_dict(data) is None
    assert messages._COMPILED.header_dict(b"\x0a\x05\x0a\x01") is None  # truncated


@needs_native
def test_the_last_occurrence_of_a_field_wins_as_in_protobuf() -> None:
    # HeaderValue with key "a" twice, then raw_value "1" and "2": the parser keeps the last of each.
    inner = b"\x0a\x01b\x0a\x01a\x1a\x011\x1a\x012"
    data = b"\x0a" + bytes([len(inner)]) + inner
    parsed = base_pb2.HeaderMap.FromString(data)
    assert messages._COMPILED is not None
    assert messages._COMPILED.header_dict(data) == messages.headers_to_dict_upb(parsed) == {"a": "2"}
