"""The native ext_proc front (`--extproc-transport=native`): HTTP/2 and gRPC framing in C (`_h2`, built at install
when a compiler is there), the asyncio server around it (`server`)."""

from __future__ import annotations

import importlib.util


def native_front_built() -> bool:
    """Whether the compiled framing was built (without importing it, nor gRPC: see `epp.app.tls.tls_policy`)."""
    return importlib.util.find_spec("epp.extproc.native._h2") is not None
