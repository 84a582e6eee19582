"""The `epp` command: one subcommand per module, each with `register(subparsers)`.

Adding a subcommand is one module here and one line in `_SUBCOMMANDS`. With no subcommand the command is `serve`
(upstream's picker takes its flags alone). Bad flags or files end with one line that
names the problem and exit code 2, as argparse does for unknown flags.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from epp import __version__
from epp.cli.upstream_flags import go_style_argv
from epp.errors import ConfigError

_SUBCOMMANDS = (
    "epp.cli.serve",
    "epp.cli.sim",
    "epp.cli.check_config",
    "epp.cli.envoy_config",
    "epp.cli.inspect_metrics",
    "epp.cli.demo",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line, not argparse's usage dump: operators read this in pod logs.
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="epp", description="Endpoint Picker for the Gateway API Inference Extension")
    parser.add_argument("--version", action="version", version=f"epp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in _SUBCOMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def upstream_argv(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """Upstream's command line as ours: no subcommand (or only flags) is `serve`, as upstream's image runs its picker
    with flags alone; Go's single-dash long flags (`-pool-name`, `-v=4`) become `--` ones for `serve`."""
    args = list(argv)
    if not args or (args[0].startswith("-") and args[0] not in ("-h", "--help", "--version")):
        args.insert(0, "serve")
    if args[0] == "serve":
        serve = _subparsers(parser).choices["serve"]
        long_options = {o for o in serve._option_string_actions if o.startswith("--")}
        args = ["serve", *go_style_argv(args[1:], long_options)]
    return args


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise LookupError("no subcommands")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(upstream_argv(parser, sys.argv[1:] if argv is None else argv))
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"epp {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_went_away()


def _reader_went_away() -> int:
    """`epp check-config … | head`: the reader closed the pipe. Exit quietly as a shell tool killed by SIGPIPE would,
    instead of a traceback (and a second one when the interpreter flushes stdout at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout is not a real file (tests' capture): nothing will be flushed into the pipe
    return 128 + signal.SIGPIPE
