"""Logging set-up: one line per record, levels from `-v` as upstream's verbosity (0 warn, 1 info, 2+ debug)."""

from __future__ import annotations

import logging
import sys


def configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # grpc and aiohttp are chatty at INFO; their warnings still show.
    for noisy in ("aiohttp.access", "grpc"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
