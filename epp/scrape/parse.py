"""A Prometheus text-format parser that reads only the series the picker needs.

A vLLM page is ~300 lines, mostly histogram buckets nobody here reads; the engine mapping needs about eight series.
So instead of tokenising every line, the parser asks C-level `str.find` where each wanted metric name occurs, looks
only at the lines those hits land on, and skips hits inside comments or label values. Typical lines
(`name{label="value",...} value [timestamp]`, no escapes) are read by one precompiled regex; any other line that
may carry a wanted series goes through `prometheus_client`'s own line parser, so odd lines (escaped quotes, spaces
around braces, names in quotes) give exactly the reference's answer. The differential tests in
tests/scrape/test_parse.py check the whole parser against `prometheus_client.parser`, line by line.

A malformed line never raises out of `PageParser.parse`: it becomes a `LineError` and the rest of the page is kept.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from prometheus_client import parser as _reference

# The reference's own line parser; typed here because prometheus_client leaves it unannotated.
_reference_parse_sample = cast(Callable[[str], Any], _reference._parse_sample)

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:")
_CACHE_LINES = 4096
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# Label keys of the common shape, joined by '"': `k=`, then `,k=` for each further label. Keys starting with "_"
# (reserved "__" names) are left to the reference.
_LABEL_KEYS = re.compile(r'[a-zA-Z][a-zA-Z0-9_]*=(?:",[a-zA-Z][a-zA-Z0-9_]*=)*')
_VALUE_TOKENS = re.compile(r"[0-9a-zA-Z.+\-]+(?: [0-9a-zA-Z.+\-]+)?")


class Sample(NamedTuple):
    """One sample line: the metric name as written, its labels, value and optional timestamp (seconds).

    A NamedTuple rather than a frozen dataclass: it is built for every wanted line of every scrape, and a tuple
    costs a quarter of a frozen dataclass's constructor.
    """

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class LineError:
    """A line that names a wanted metric but does not parse."""

    line_number: int  # 1-based
    name: str  # the wanted metric the line appears to carry
    reason: str

    def __str__(self) -> str:
        return f"line {self.line_number} ({self.name}): {self.reason}"


@dataclass(slots=True)
class ParsedPage:
    """The wanted samples of one page, by metric name in page order, and the wanted lines that did not parse."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)
    errors: list[LineError] = field(default_factory=list)

    def of(self, name: str) -> list[Sample]:
        return self.samples.get(name, [])


def _timestamp(token: str) -> float:
    """Milliseconds in the text, seconds out, rounded as the reference rounds (exact int division when integral)."""
    if "_" in token or token != token.strip():
        raise ValueError(f"invalid timestamp {token!r}")
    try:
        return int(token) / 1000
    except ValueError:
        return float(token) / 1000


def _common_shape(line: str, name_len: int) -> Sample | None:
    """The common line shape `name{k="v",...} value [ts]` (no backslash, single spaces), read with str methods.

    Returns None for any other shape, which then goes to the reference line parser: this path only answers where
    its answer is certainly the reference's.
    """
    if "\\" in line:
        return None
    labels: dict[str, str] = {}
    if line[name_len] == "{":
        close = line.rfind("}")
        if close < 0:
            return None
        parts = line[name_len + 1 : close].split('"')
        if parts.pop() not in ("", ","):
            return None
        if parts:
            keys = parts[0::2]
            if len(keys) != len(parts) // 2 or not _LABEL_KEYS.fullmatch('"'.join(keys)):
                return None
            labels = dict(zip([k[:-1].lstrip(",") for k in keys], parts[1::2], strict=True))
            if len(labels) != len(keys):
                raise ValueError("duplicate label name")
        rest = line[close + 1 :]
    else:
        rest = line[name_len:]
    tokens = rest.split(" ")
    if len(tokens) not in (2, 3) or tokens[0] or not _VALUE_TOKENS.fullmatch(" ".join(tokens[1:])):
        return None
    # float() equals the reference's int()-then-float for these characters (no "_", no spaces).
    return Sample(line[:name_len], labels, float(tokens[1]), _timestamp(tokens[2]) if len(tokens) == 3 else None)


def parse_line(line: str) -> Sample:
    """Parse one stripped, non-comment line; raises as the reference does."""
    m = _NAME.match(line)
    if m is not None and m.end() < len(line):
        sample = _common_shape(line, m.end())
        if sample is not None:
            return sample
    ref = _reference_parse_sample(line)
    timestamp = ref.timestamp
    return Sample(str(ref.name), dict(ref.labels), float(ref.value), None if timestamp is None else float(timestamp))


def _trie_pattern(names: list[str]) -> str:
    """One regex alternation for several names, factored by common prefix (`vllm:(?:num_requests_(?:waiting|
    running)|…)`): the regex engine then compares a shared prefix once per line instead of once per name, which
    halves the scan of a page. Longer names come first inside a group, so `x` cannot shadow `x_total`; the
    lookahead after the pattern rejects a longer name anyway."""
    if len(names) == 1:
        return re.escape(names[0])
    groups: dict[str, list[str]] = {}
    ends = False
    for n in names:
        if n:
            groups.setdefault(n[0], []).append(n[1:])
        else:
            ends = True
    parts = []
    for first, rests in sorted(groups.items()):
        parts.append(re.escape(first) + (_trie_pattern(rests) if rests != [""] else ""))
    body = "|".join(parts)
    if ends:
        return "(?:" + body + ")?"
    return body if len(parts) == 1 else "(?:" + body + ")"


class PageParser:
    """Reads the samples of a fixed set of metric names from Prometheus text pages; build once, reuse per page.

    One precompiled regex finds every line that starts with a wanted name (the name ending there) or with "{" (a
    name quoted inside the braces); all other lines (comments, histogram buckets, other series) are never
    looked at.

    Parsed lines are remembered (up to `_CACHE_LINES`): between two scrapes, and between endpoints serving the
    same model, most wanted lines are byte-identical (info series, idle gauges), and a dict lookup costs a tenth
    of parsing the line again. Samples are therefore shared: callers must not mutate them (nothing here does).
    """

    __slots__ = ("_cache", "_first", "_rest", "names")

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(n for n in names if n)
        alternation = _trie_pattern(sorted(self.names)) if self.names else "(?!)"
        tail = r"(?:(?:" + alternation + r")(?![a-zA-Z0-9_:])|\{)"  # no capture group: it halves the speed
        self._rest = re.compile(r"\n\s*" + tail)
        self._first = re.compile(r"[^\S\n]*" + tail)  # the first line: whitespace, but not across a newline
        self._cache: dict[str, Sample | str] = {}  # line → its sample, or why it does not parse

    def parse(self, text: str) -> ParsedPage:
        page = ParsedPage()
        first = self._first.match(text)
        if first is not None:
            self._take(page, text, first)
        for m in self._rest.finditer(text):
            self._take(page, text, m)
        return page

    def _take(self, page: ParsedPage, text: str, m: re.Match[str]) -> None:
        matched = m.group().lstrip()
        name = None if matched == "{" else matched
        start = m.end() - len(matched)
        end = text.find("\n", start)
        line = text[start:end].strip() if end >= 0 else text[start:].strip()
        sample = self._cache.get(line)
        if sample is None:
            try:
                sample = parse_line(line)
            except Exception as exc:  # the reference line parser: any exception means "does not parse"
                sample = (str(exc) or type(exc).__name__)[:200]
            if len(self._cache) >= _CACHE_LINES:
                self._cache.clear()
            self._cache[line] = sample
        if isinstance(sample, str):
            if name is not None:
                page.errors.append(LineError(text.count("\n", 0, start) + 1, name, sample))
            return
        if sample.name in self.names:
            page.samples.setdefault(sample.name, []).append(sample)


def parse_page(text: str, names: Iterable[str]) -> ParsedPage:
    """Every sample of the given names, and the malformed lines that carry them."""
    return PageParser(names).parse(text)
