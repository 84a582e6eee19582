"""Typed reading of a plugin's `parameters` mapping, with errors that name the file, the plugin and the field.

Upstream decodes parameters with Go's json.Unmarshal, which silently ignores misspelt fields; we refuse them
instead, because a typo in `lruCapacityPerServer` that silently falls back to the default is a production incident
nobody can see. Every field a plugin reads must be consumed; `finish()` refuses the rest.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from epp.config.durations import parse_duration
from epp.errors import ConfigError

_T = TypeVar("_T")


def _recorded(getter: Callable[..., _T]) -> Callable[..., _T]:
    """Keep what a getter returned (the file's value or the default) in `Params.effective`, for check-config."""

    @functools.wraps(getter)
    def read(self: Params, field: str, *args: Any, **kwargs: Any) -> _T:
        value = getter(self, field, *args, **kwargs)
        self.effective[field] = value
        return value

    return read


class Params:
    """Reads one plugin's parameters; each getter removes the key so `finish()` can name the leftovers.

    `effective` collects every field read with the value the plugin got, defaults included: the profile a file
    builds, as `epp check-config` prints it.
    """

    def __init__(self, raw: Mapping[str, Any] | None, where: str) -> None:
        self._left = dict(raw or {})
        self.where = where  # e.g. "config.yaml: plugin 'prefix' (prefix-cache-scorer)"
        self.effective: dict[str, Any] = {}

    def error(self, field: str, why: str) -> ConfigError:
        return ConfigError(f"{self.where}: parameter '{field}': {why}")

    def rest(self) -> dict[str, Any]:
        """Everything not read yet, handed on whole (for plugins whose parameters another layer checks)."""
        rest, self._left = self._left, {}
        self.effective.update(rest)
        return rest

    def given(self, field: str) -> bool:
        """Whether the file sets `field` (not read yet): for parameters that have no default."""
        return self._left.get(field) is not None

    def _take(self, field: str) -> Any:
        return self._left.pop(field, None)

    @_recorded
    def integer(self, field: str, default: int, minimum: int | None = None) -> int:
        value = self._take(field)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise self.error(field, f"expected an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.error(field, f"must be >= {minimum}, got {value}")
        return int(value)

    @_recorded
    def number(self, field: str, default: float, minimum: float | None = None, maximum: float | None = None) -> float:
        value = self._take(field)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.error(field, f"expected a number, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.error(field, f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.error(field, f"must be <= {maximum}, got {value}")
        return float(value)

    @_recorded
    def flag(self, field: str, default: bool) -> bool:
        value = self._take(field)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(field, f"expected true or false, got {value!r}")
        return value

    @_recorded
    def text(self, field: str, default: str) -> str:
        value = self._take(field)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(field, f"expected a string, got {value!r}")
        return value

    @_recorded
    def duration(self, field: str, default: float) -> float:
        value = self._take(field)
        if value is None:
            return default
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise self.error(field, str(exc)) from None

    @_recorded
    def mapping(self, field: str) -> dict[str, str]:
        value = self._take(field)
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise self.error(field, f"expected a mapping of strings, got {value!r}")
        return {k: str(v) for k, v in value.items()}

    @_recorded
    def strings(self, field: str) -> tuple[str, ...]:
        value = self._take(field)
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(field, f"expected a list of strings, got {value!r}")
        return tuple(value)

    @_recorded
    def section(self, field: str) -> dict[str, Any]:
        """A nested mapping (e.g. token-producer's `vllm:`), read further with `Params(value, ...)`."""
        value = self._take(field)
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise self.error(field, f"expected a mapping, got {value!r}")
        return dict(value)

    @_recorded
    def records(self, field: str) -> tuple[dict[str, Any], ...]:
        """A list of mappings (e.g. label-selector-filter's `matchExpressions`)."""
        value = self._take(field)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
            raise self.error(field, f"expected a list of mappings, got {value!r}")
        return tuple(dict(v) for v in value)

    def present(self, field: str) -> bool:
        """Whether the file sets `field` (not yet read)."""
        return field in self._left

    def ignore(self, *fields: str) -> None:
        """Fields upstream accepts that have no effect here (documented where they are ignored)."""
        for field in fields:
            self._left.pop(field, None)

    def finish(self) -> None:
        if self._left:
            names = ", ".join(sorted(map(str, self._left)))
            raise ConfigError(f"{self.where}: unknown parameter(s) {names}")
