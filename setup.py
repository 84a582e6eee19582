"""The compiled kernels of `epp.kvevents` (block keys, shared-table lookups): optional, so an install without a
compiler (a slim image) still works and runs the numpy code they are measured against (`epp.kvevents.kernels`).
Everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "epp.kvevents._native",
            ["epp/kvevents/_native.c"],
            optional=True,
        )
    ]
)
