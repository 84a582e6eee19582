"""The fast parser against `prometheus_client.parser`, the reference, line by line.

The reference is run on each line alone (that is how it reads them: one line at a time, with no state that
changes a sample), so a page the reference rejects as a whole (one bad line anywhere) is still compared on every
other line. Counter samples are compared under their written name: the reference renames `x` to `x_total` only
when a TYPE line says counter, which is bookkeeping, not parsing.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from epp.scrape.parse import PageParser, parse_line, parse_page
from tests.scrape.vllm_page import vllm_page

_NAME_START = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")

Row = tuple[str, tuple[tuple[str, str], ...], float, float | None]


def _row(name: str, labels: dict[str, str], value: float, ts: float | None) -> Row:
    return (name, tuple(sorted(labels.items())), float(value), None if ts is None else float(ts))


def reference(text: str, names: set[str]) -> tuple[dict[str, list[Row]], set[int]]:
    """Samples of `names` by the reference, and the numbers of the lines that carry a wanted name but fail."""
    rows: dict[str, list[Row]] = {}
    bad: set[int] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            samples = [s for family in text_string_to_metric_families(raw) for s in family.samples]
        except Exception:
            m = _NAME_START.match(raw)
            if m and m.group(1) in names:
                bad.add(number)
            continue
        for s in samples:
            if s.name in names:
                rows.setdefault(s.name, []).append(_row(s.name, s.labels, s.value, s.timestamp))
    return rows, bad


def ours(text: str, names: set[str]) -> tuple[dict[str, list[Row]], set[int]]:
    page = parse_page(text, names)
    rows = {n: [_row(*s) for s in samples] for n, samples in page.samples.items()}
    return rows, {e.line_number for e in page.errors}


def _same(a: dict[str, list[Row]], b: dict[str, list[Row]]) -> bool:
    def norm(rows: dict[str, list[Row]]) -> dict[str, list[tuple[object, ...]]]:
        return {
            n: [(r[0], r[1], "nan" if math.isnan(r[2]) else r[2], r[3]) for r in rs] for n, rs in rows.items() if rs
        }

    return norm(a) == norm(b)


def assert_agrees(text: str, names: set[str]) -> None:
    ref_rows, ref_bad = reference(text, names)
    our_rows, our_bad = ours(text, names)
    assert _same(our_rows, ref_rows), (our_rows, ref_rows)
    assert our_bad == ref_bad


def _names_on(text: str) -> set[str]:
    names = set()
    for line in text.split("\n"):
        m = _NAME_START.match(line)
        if m and not line.lstrip().startswith("#"):
            names.add(m.group(1))
    return names


# -- the committed pages ---------------------------------------------------------------------------------------


def test_agrees_with_the_reference_on_every_committed_page(reference_data: Path) -> None:
    pages = sorted((reference_data / "metrics").glob("*.txt"))
    assert pages, "no pages in tests/data/metrics"
    for path in pages:
        text = path.read_text()
        names = _names_on(text) | {"vllm:num_requests_waiting", "sglang:num_queue_reqs", "nv_trt_llm_request_metrics"}
        assert_agrees(text, names)


def test_agrees_on_the_whole_vllm_page() -> None:
    page = vllm_page()
    names = _names_on(page)
    assert_agrees(page, names)
    # the page parses as a whole too: every sample line is read
    whole = sum(len(f.samples) for f in text_string_to_metric_families(page))
    assert sum(len(v) for v in parse_page(page, names).samples.values()) == whole


# -- chosen lines ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("m 1", ("m", {}, 1.0, None)),
        ('m{a="b"} 2.5', ("m", {"a": "b"}, 2.5, None)),
        ('m{a="b",} -1e3 1700000000000', ("m", {"a": "b"}, -1000.0, 1700000000.0)),
        ('m{a="x\\"y\\\\z\\nw"} 1', ("m", {"a": 'x"y\\z\nw'}, 1.0, None)),
        ('m{a="}{,="} +Inf', ("m", {"a": "}{,="}, math.inf, None)),
        ("m -Inf", ("m", {}, -math.inf, None)),
        ('m { a = "b" } 3', ("m", {"a": "b"}, 3.0, None)),
        ('{"m", a="b"} 4', ("m", {"a": "b"}, 4.0, None)),
        ("m\t5", ("m", {}, 5.0, None)),
    ],
    ids=[
        "plain",
        "labels",
        "trailing-comma-exponent-timestamp",
        "escapes",
        "braces-in-value",
        "minus-inf",
        "spaces-around",
        "quoted-name",
        "tab",
    ],
)
def test_reads_lines_as_the_reference_does(line: str, expected: tuple[object, ...]) -> None:
    assert tuple(parse_line(line)) == expected
    assert_agrees(line, {"m"})


def test_nan_value() -> None:
    assert math.isnan(parse_line("m NaN").value)


@pytest.mark.parametrize(
    "line",
    ['m{a="b"', "m", "m 1_0", 'm{a="b",a="c"} 1', 'm{__r="x"} 1', "m{a=b} 1", "m 0x10", 'm{a="b"} '],
    ids=["truncated", "no-value", "underscore", "duplicate-label", "reserved-label", "unquoted", "hex", "empty"],
)
def test_rejects_lines_the_reference_rejects(line: str) -> None:
    page = parse_page(line, {"m"})
    assert page.samples == {}
    assert [e.line_number for e in page.errors] == [1]
    assert_agrees(line, {"m"})


def test_skips_comments_other_series_and_names_inside_label_values() -> None:
    text = '# HELP m help m\n# TYPE m gauge\nm_total 3\nother{x="m 1"} 2\nm 7\n  m 8\n'
    page = PageParser(["m"]).parse(text)
    assert [s.value for s in page.of("m")] == [7.0, 8.0]
    assert page.errors == []


def test_several_series_per_name_in_page_order() -> None:
    text = 'm{e="0"} 1\nx 0\nm{e="1"} 2\n'
    assert [s.labels["e"] for s in parse_page(text, ["m"]).of("m")] == ["0", "1"]


def test_a_name_that_prefixes_another_is_not_confused() -> None:
    text = "ab 1\nabc 2\na 3\n"
    page = parse_page(text, ["a", "ab", "abc"])
    assert {n: [s.value for s in v] for n, v in page.samples.items()} == {"ab": [1.0], "abc": [2.0], "a": [3.0]}


def test_binary_garbage_never_raises() -> None:
    garbage = bytes(range(256)).decode("latin-1") * 20 + "\nm 1\n\x00m{\n"
    page = parse_page(garbage, ["m"])
    assert [s.value for s in page.of("m")] == [1.0]
    assert_agrees(garbage, {"m"})


# -- generated pages -------------------------------------------------------------------------------------------

_WANTED = ["vllm:num_requests_waiting", "m", "m_total", "sglang:token_usage"]
_names = st.sampled_from([*_WANTED, "vllm:num_requests_waiting_by_reason", "mm", "other", "1bad", "m:x"])
_keys = st.sampled_from(["a", "model_name", "le", "__name__", "__r", "b1", "1a", "a-b", '"q"'])
_value_text = st.one_of(
    st.sampled_from(["a", "", "x y", "}", "{", ",", "=", "#", " # ", "é", "中文", "\t"]),
    st.text(alphabet='ab\\"n, {}=#', max_size=6),
)
_numbers = st.sampled_from(
    [
        "1",
        "0",
        "-2",
        "1.5",
        "-1e3",
        "2E-3",
        "NaN",
        "nan",
        "+Inf",
        "-Inf",
        "inf",
        "1_0",
        "0x10",
        "abc",
        "",
        "1.",
        ".5",
        "12345678901234567890",
    ]
)
_timestamps = st.sampled_from(["", " 1700000000000", " -5", " 1.5", " abc", " 1 2", "\t3", " 12345678901234567891"])
_ws = st.sampled_from(["", " ", "  ", "\t", "\r", "\x0b"])


@st.composite
def _label_block(draw: st.DrawFn) -> str:
    n = draw(st.integers(0, 3))
    pairs = []
    for _ in range(n):
        key = draw(_keys)
        value = draw(_value_text)
        quote = draw(st.sampled_from(['"', '"', '"', ""]))
        pairs.append(f"{key}{draw(st.sampled_from(['=', '=', ' = ']))}{quote}{value}{quote}")
    sep = draw(st.sampled_from([",", ",", ", ", ",,"]))
    trailing = draw(st.sampled_from(["", "", ","]))
    return "{" + sep.join(pairs) + trailing + "}"


@st.composite
def _sample_line(draw: st.DrawFn) -> str:
    name = draw(_names)
    labels = draw(st.one_of(st.just(""), _label_block()))
    if draw(st.integers(0, 9)) == 0:
        labels = labels[:1] + f'"{name}",' + labels[1:] if labels else '{"' + name + '"}'
        name = ""
    line = f"{draw(_ws)}{name}{draw(st.sampled_from(['', '', ' ']))}{labels}"
    line += f"{draw(st.sampled_from([' ', ' ', '  ', chr(9)]))}{draw(_numbers)}{draw(_timestamps)}{draw(_ws)}"
    if draw(st.integers(0, 7)) == 0:
        line = line[: draw(st.integers(0, len(line)))]  # truncated
    return line


_lines = st.one_of(
    _sample_line(),
    _sample_line(),
    _sample_line(),
    st.sampled_from(["", "# HELP m some help", "# TYPE m gauge", "# TYPE m counter", "#", "# a comment m 1"]),
    st.text(max_size=30),
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_lines, max_size=12))
def test_agrees_with_the_reference_on_generated_pages(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert_agrees(text, set(_WANTED))


def test_a_parser_reused_across_pages_answers_the_same() -> None:
    parser = PageParser(["m"])
    text = 'm{a="b"} 1\nm{a="b" 2\nm 3\n'
    first = parser.parse(text)
    again = parser.parse(text)  # every line now comes from the line cache
    assert again.samples == first.samples
    assert [(e.line_number, e.reason) for e in again.errors] == [(e.line_number, e.reason) for e in first.errors]
    assert [e.line_number for e in again.errors] == [2]
