"""Kubernetes label selectors in their text form (`kubectl -l`, upstream's `--endpoint-selector`), parsed and matched.

The grammar and the meaning are the API machinery's (`labels.Parse`), so a selector means here what it means to
kubectl and to upstream's picker:

    app=vllm, app==vllm     the label is present with that value (an empty value: `tier=`)
    tier!=frontend          the label is absent, or has another value
    env in (prod,staging)   present with one of the values
    env notin (dev)         absent, or none of the values
    gpu                     present (any value)
    !canary                 absent
    rank>3, rank<8          present, an integer, greater / less than the number

Requirements are separated by commas and all must hold (AND). Keys are qualified names (`prefix/name`), values
label values (63 characters at most), checked as the API server checks them. A malformed selector is a
`SelectorError` whose message says what was found and what was expected, in the API machinery's words. Pure: no
I/O, so the endpoint rules in the datastore can use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_KEY_NAME = re.compile(rf"^{_NAME}$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_VALUE = re.compile(rf"^({_NAME})?$")
_INTEGER = re.compile(r"^[-+]?[0-9]+$")

_SYMBOLS = frozenset("=!(),<>")  # what ends an identifier, besides white space
_SYMBOL_TOKENS = ("!=", "==", "=", "!", "(", ")", ",", "<", ">")  # longest first: "!=" before "!"
_WHITESPACE = frozenset(" \t\r\n")
_INT64 = 1 << 63

EXISTS = "exists"
DOES_NOT_EXIST = "!"
EQUALS = "="
DOUBLE_EQUALS = "=="
NOT_EQUALS = "!="
IN = "in"
NOT_IN = "notin"
GREATER_THAN = ">"
LESS_THAN = "<"


class SelectorError(ValueError):
    """A selector that does not parse, or a key or value the API server would refuse."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One clause of a selector: a key, an operator (the module's constants) and its values."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        op = self.operator
        if op == EXISTS:
            return value is not None
        if op == DOES_NOT_EXIST:
            return value is None
        if op in (EQUALS, DOUBLE_EQUALS, IN):
            return value is not None and value in self.values
        if op in (NOT_EQUALS, NOT_IN):
            return value is None or value not in self.values
        if value is None or not _INTEGER.match(value) or not -_INT64 <= int(value) < _INT64:
            return False  # > and <: the label must be a 64-bit integer too
        number, bound = int(value), int(self.values[0])
        return number > bound if op == GREATER_THAN else number < bound

    def __str__(self) -> str:
        if self.operator == EXISTS:
            return self.key
        if self.operator == DOES_NOT_EXIST:
            return f"!{self.key}"
        if self.operator in (IN, NOT_IN):
            return f"{self.key} {self.operator} ({','.join(self.values)})"
        return f"{self.key}{self.operator}{self.values[0]}"


def selector_matches(requirements: tuple[Requirement, ...], labels: Mapping[str, str]) -> bool:
    """Every requirement holds (an empty selector matches everything, as the API machinery's does)."""
    return all(r.matches(labels) for r in requirements)


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """The requirements of a selector's text form; SelectorError (a ValueError) when it is malformed."""
    return _Parser(_tokens(text)).parse()


def _tokens(text: str) -> list[str]:
    """Identifiers and symbols; an identifier runs to the next white space or symbol."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _WHITESPACE:
            i += 1
        elif ch in _SYMBOLS:
            symbol = next(s for s in _SYMBOL_TOKENS if text.startswith(s, i))  # each symbol is a token by itself
            out.append(symbol)
            i += len(symbol)
        else:
            j = i
            while j < n and text[j] not in _WHITESPACE and text[j] not in _SYMBOLS:
                j += 1
            out.append(text[i:j])
            i = j
    return out


def _is_identifier(token: str | None) -> bool:
    return token is not None and token not in _SYMBOL_TOKENS


class _Parser:
    """Recursive descent over the tokens, following the API machinery's parser (and its error messages)."""

    def __init__(self, tokens: list[str]) -> None:
        self._tokens = tokens
        self._at = 0

    def _peek(self) -> str | None:
        return self._tokens[self._at] if self._at < len(self._tokens) else None

    def _take(self) -> str | None:
        token = self._peek()
        self._at += 1
        return token

    def parse(self) -> tuple[Requirement, ...]:
        requirements: list[Requirement] = []
        while True:
            token = self._peek()
            if token is None:
                return tuple(requirements)
            if not (_is_identifier(token) or token == "!"):
                raise SelectorError(f"found '{token}', expected: !, identifier, or 'end of string'")
            requirements.append(self._requirement())
            token = self._take()
            if token is None:
                return tuple(requirements)
            if token != ",":
                raise SelectorError(f"found '{token}', expected: ',' or 'end of string'")
            after = self._peek()
            if not (_is_identifier(after) or after == "!"):
                raise SelectorError(f"found '{after or ''}', expected: identifier after ','")

    def _requirement(self) -> Requirement:
        negated = self._peek() == "!"
        if negated:
            self._take()
        key = self._take()
        if not _is_identifier(key):
            raise SelectorError(f"found '{key or ''}', expected: identifier")
        assert key is not None
        _check_key(key)
        if negated:
            return Requirement(key, DOES_NOT_EXIST)
        if self._peek() in (None, ","):
            return Requirement(key, EXISTS)
        operator = self._take()
        if operator in ("in", "notin"):
            values = self._value_set()
        elif operator in (EQUALS, DOUBLE_EQUALS, NOT_EQUALS, GREATER_THAN, LESS_THAN):
            values = (self._exact_value(),)
        else:
            raise SelectorError(f"found '{operator}', expected: in, notin, =, ==, !=, gt, lt")
        for value in values:
            _check_value(key, value)
        if operator in (GREATER_THAN, LESS_THAN) and not (
            _INTEGER.match(values[0]) and -_INT64 <= int(values[0]) < _INT64
        ):
            raise SelectorError(f"{key}: for 'Gt', 'Lt' operators, the value must be an integer, got {values[0]!r}")
        assert operator is not None
        return Requirement(key, operator, values)

    def _exact_value(self) -> str:
        token = self._peek()
        if token in (None, ","):
            return ""  # `key=` selects the empty value
        self._take()
        if not _is_identifier(token):
            raise SelectorError(f"found '{token}', expected: identifier")
        assert token is not None
        return token

    def _value_set(self) -> tuple[str, ...]:
        token = self._take()
        if token != "(":
            raise SelectorError(f"found '{token or ''}', expected: '('")
        values: list[str] = []
        expect_value = True
        while True:
            token = self._take()
            if token == ")":
                if expect_value and values:  # a trailing comma: `(a,)` holds the empty value
                    values.append("")
                return tuple(sorted(set(values or [""])))
            if token == ",":
                if expect_value:
                    values.append("")  # `(,a)` and `(a,,b)`: empty values, as the API machinery reads them
                expect_value = True
            elif _is_identifier(token) and expect_value:
                assert token is not None
                values.append(token)
                expect_value = False
            else:
                raise SelectorError(f"found '{token or ''}', expected: ',', ')' or identifier")


def _check_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise SelectorError(f"{key!r}: the prefix of a label key must be a DNS subdomain")
    if not name or len(name) > 63 or not _KEY_NAME.match(name):
        raise SelectorError(
            f"{key!r}: a label key's name must be 63 characters or less, alphanumerics with '-', '_' or '.' "
            "between, starting and ending with an alphanumeric"
        )


def _check_value(key: str, value: str) -> None:
    if len(value) > 63 or not _VALUE.match(value):
        raise SelectorError(
            f"{key}: {value!r} is not a label value (63 characters or less, empty or alphanumerics with '-', '_' "
            "or '.' between, starting and ending with an alphanumeric)"
        )
