#!/usr/bin/env bash
# Serving-worker scaling on a many-core machine that reaches nothing (no package index, no apt): the picker through
# a real Envoy, `epp serve --workers 1,2,...` side by side with the no-op Python ext_proc (benchmarks/routers.py:
# wrk, CPU per request from /proc of every process), from the carried tree and the kit benchmarks/device_kit.sh
# made (KIT, default .devkit). Bounded: two routers runs of 2 concurrencies each, 5 s rounds, about 6 minutes in
# all on 16 cores. Results (JSON, the Markdown tables, the logs) go to $OUT (default ./out).
#   PY      the target's Python (default python3; the kit's wheels must be for its version)
#   SKIP_WHEELS=1   the Python already has every dependency (a venv from `make install`)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
KIT="${KIT:-$PWD/.devkit}"
PY="${PY:-python3}"
SITE=/tmp/epp-site
mkdir -p "$OUT"
exec > >(tee "$OUT/device_scaling.log") 2>&1
echo "nproc $(nproc); $(uname -r); $($PY --version 2>&1)"
if [ "${SKIP_WHEELS:-0}" != 1 ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$KIT"/*.whl \
        || { echo "wheels did not install"; exit 1; }
    export PYTHONPATH="$PWD:$SITE"
else
    export PYTHONPATH="$PWD"
fi
xz -dc "$KIT/envoy.xz" > /tmp/envoy && chmod +x /tmp/envoy && export EPP_ENVOY_BIN=/tmp/envoy
/tmp/envoy --version | head -1
mkdir -p /tmp/kitbin && cp "$KIT/wrk" /tmp/kitbin/ && chmod +x /tmp/kitbin/wrk
export PATH="/tmp/kitbin:$PATH" LD_LIBRARY_PATH="$KIT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
wrk --version 2>&1 | head -1
# The optional C extensions, built for this Python (without them the picker runs its Python definitions and the
# native ext_proc front falls back to grpc.aio: a different picker from the one measured elsewhere).
$PY setup.py -q build_ext --inplace > "$OUT/build_ext.log" 2>&1 || { echo "build_ext failed:"; tail -20 "$OUT/build_ext.log"; }
$PY - <<'PY'
from epp.extproc.native import native_front_built
import epp.scheduling._native as s, epp.scheduling._receipt as r, epp.app._pick_log as p
print("native front built:", native_front_built(), "| kernels:", s.ENABLED, r.ENABLED, p.ENABLED)
PY
run() {  # name, then routers.py's arguments
    local name=$1; shift
    echo "== $name: $*"
    timeout 300 $PY -m benchmarks.routers "$@" --json "$OUT/$name.json" | tee "$OUT/$name.md"
}
# As benchmarks/RESULTS.md's routers table is measured on 2 cores, then wider.
run routers_w12 --concurrency 16,64 --seconds 5 --rounds 3 --workers 1,2
run routers_w1248 --concurrency 64,256 --seconds 5 --rounds 2 --workers 1,2,4,8 \
    --envoy-concurrency "$(( $(nproc) / 4 > 2 ? $(nproc) / 4 : 2 ))"
