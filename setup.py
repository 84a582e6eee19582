"""The compiled kernels of `epp.kvevents` (block keys, shared-table lookups), of `epp.scheduling.totals` (the
runner's weighted total and tie search), the serving workers' pick log (`epp.app.pick_log`), the ext_proc request header map (`epp.extproc.messages`) and the ext_proc
front's HTTP/2 framing (`epp.extproc.native`): optional, so an install without a
compiler (a slim image) still works and runs the numpy code they are measured against (`epp.kvevents.kernels`).
Everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "epp.kvevents._native",
            ["epp/kvevents/_native.c"],
            depends=["epp/optional_module.h", "epp/struct_wire.h"],
            optional=True,
        ),
        # The profile runner's weighted total and tie search (epp.scheduling.totals): without it numpy runs them.
        Extension(
            "epp.scheduling._native",
            ["epp/scheduling/_native.c"],
            depends=["epp/optional_module.h", "epp/struct_wire.h"],
            optional=True,
        ),
        # The serving workers' pick log, a record per call (epp.app.pick_log): without it the Python code runs.
        Extension(
            "epp.app._pick_log",
            ["epp/app/_pick_log.c"],
            depends=["epp/optional_module.h", "epp/struct_wire.h"],
            optional=True,
        ),
        # A route receipt's terms and JSON (epp.scheduling.receipt): without it the Python code runs them.
        Extension(
            "epp.scheduling._receipt",
            ["epp/scheduling/_receipt.c"],
            depends=["epp/optional_module.h", "epp/struct_wire.h"],
            optional=True,
        ),
        # The envoy.lb metadata of an answer with scores or a receipt, as wire bytes (epp.extproc.messages).
        Extension(
            "epp.extproc._metadata",
            ["epp/extproc/_metadata.c"],
            depends=["epp/optional_module.h", "epp/struct_wire.h"],
            optional=True,
        ),
        # Envoy's header map read from its bytes (epp.extproc.messages): without it upb's wrappers are read.
        Extension(
            "epp.extproc._headers",
            ["epp/extproc/_headers.c"],
            depends=["epp/optional_module.h", "epp/struct_wire.h"],
            optional=True,
        ),
        # The ext_proc front's HTTP/2 + gRPC framing (epp.extproc.native): without it the grpc.aio adapter serves.
        Extension(
            "epp.extproc.native._h2",
            [
                "epp/extproc/native/module.c",
                "epp/extproc/native/h2.c",
                "epp/extproc/native/h2_recv.c",
                "epp/extproc/native/hpack.c",
            ],
            depends=[
                "epp/extproc/native/h2.h",
                "epp/extproc/native/hpack.h",
                "epp/extproc/native/hpack_tables.h",
            ],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
    ]
)
