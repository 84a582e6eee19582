#!/usr/bin/env bash
# Serving-worker scaling on a many-core machine: `epp serve --workers 1,2,4,8` through a real Envoy, side by side
# with a no-op ext_proc, from the carried tree. Bounded: each of 4 worker counts × 1 mode × 1 concurrency × 2
# rounds × 15 s, plus warm-ups and start-up, stays under 6 minutes. Results (JSON and the Markdown table) go to
# $OUT (default ./out).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
if ! command -v hey >/dev/null; then
    (apt-get install -y hey >/dev/null 2>&1 || true)
fi
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
fi
nproc > "$OUT/nproc.txt"
timeout 360 .venv/bin/python -m benchmarks.extproc_overhead \
    --workers 1,2,4,8 --envoy-concurrency "$(( $(nproc) / 4 > 2 ? $(nproc) / 4 : 2 ))" \
    --modes request --concurrency 256 --seconds 15 --rounds 2 \
    --json "$OUT/extproc_overhead_workers.json" | tee "$OUT/extproc_overhead_workers.md"
