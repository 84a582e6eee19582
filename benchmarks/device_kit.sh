#!/usr/bin/env bash
# Makes the kit benchmarks/device_scaling.sh needs on a machine that reaches nothing: run it here, where the package
# index is reachable, after `make install`; it writes KIT (default .devkit, ignored by git: add `/.devkit/` to
# .git/info/exclude) and the kit travels with the tree (the device tool's `carry: [".devkit"]`).
#   - the wheels `epp serve` and the benchmarks import that the target's Python may lack, for its version (PYVER,
#     default 3.12), pinned as constraints.txt pins them, and setuptools ≥ 77 for setup.py's licence field;
#   - the Envoy binary of .venv/tools, xz-compressed (a third of its size: the carried tree is size-limited);
#   - `wrk` and its LuaJIT library, from this machine (Debian package `wrk`).
# Wheels the target already has (numpy, uvloop, aiohttp, PyYAML, prometheus-client) are not fetched: name more in
# EXTRA if its image lacks them.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT="${KIT:-$PWD/.devkit}"
PYVER="${PYVER:-3.12}"
mkdir -p "$KIT"
pins() { for name in "$@"; do grep -i "^$name==" constraints.txt; done; }
# shellcheck disable=SC2046
.venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$KIT" \
    $(pins grpcio grpcio-health-checking protobuf xds-protos orjson pyzmq msgspec cryptography cffi pycparser) \
    'setuptools>=77' ${EXTRA:-}
xz -T0 -6 -c .venv/tools/envoy/_bin/envoy > "$KIT/envoy.xz"
cp "$(command -v wrk)" "$KIT/wrk"
cp "$(ldd "$(command -v wrk)" | awk '/libluajit/ {print $3}')" "$KIT/"
du -sh "$KIT"
