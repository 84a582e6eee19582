"""Wires the picker's components for `epp serve` (filled in by the Foundation work)."""

from __future__ import annotations

import argparse


def serve_from_args(args: argparse.Namespace) -> int:
    raise NotImplementedError
