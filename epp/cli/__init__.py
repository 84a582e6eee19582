"""The `epp` command: one subcommand per module, each with `register(subparsers)`.

Adding a subcommand is one module here and one line in `_SUBCOMMANDS`. Bad flags or files end with one line that
names the problem and exit code 2, as argparse does for unknown flags.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from epp.errors import ConfigError

_SUBCOMMANDS = (
    "epp.cli.serve",
    "epp.cli.sim",
    "epp.cli.check_config",
    "epp.cli.envoy_config",
    "epp.cli.inspect_metrics",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line, not argparse's usage dump: operators read this in pod logs.
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="epp", description="Endpoint Picker for the Gateway API Inference Extension")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in _SUBCOMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"epp {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
