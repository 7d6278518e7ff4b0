#!/usr/bin/env bash
# Every GPU check of kvgrant, in one go, on a CUDA host (run on 2 x H200 for the docs).
#   tools/gpu_checks.sh [OUTDIR]
# Environment: TRACE_PAIRS (default 100), TRACE_CHUNK (records the trace writer ships at once),
# TRACE_TIME_LIMIT (seconds of pairs at most; the figures cover the pairs done).
# Installs kvgrant (editable, no dependencies) into the interpreter that holds
# cuda-bindings and torch -- $PYTHON, default python3: use a venv or a throwaway machine --
# after the wheels in .whl/ when present (for hosts without PyPI), then runs: the
# GPU-marked tests, the start-up benchmark, and the CLI on a published-scale layout scaled
# to the GPUs present, whose traces the Python conformance engine must accept.
set -uo pipefail
OUTDIR=${1:-${OUT:-out/gpu}}
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 1
fi
"$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUTDIR/install.log" 2>&1 \
    || { tail -20 "$OUTDIR/install.log"; exit 1; }
KV="$PY -m kvgrant"
NGPU=$(nvidia-smi -L | wc -l)
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  "$PY" -c "import sys, cuda.bindings; print('python', sys.version.split()[0], 'cuda-bindings', cuda.bindings.__version__)"
  date -u; } | tee "$OUTDIR/machine.txt"

rc=0
"$PY" -m pytest -q -p no:cacheprovider tests -m "gpu or gpu2" -rA 2>&1 | tee "$OUTDIR/pytest_gpu.txt" | tail -40
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1

"$PY" benchmarks/bench_startup.py examples/published-dcp16.json --ranks "$NGPU" --backend cuda \
    --trace-pairs "${TRACE_PAIRS:-100}" ${TRACE_CHUNK:+--trace-chunk "$TRACE_CHUNK"} \
    ${TRACE_TIME_LIMIT:+--time-limit "$TRACE_TIME_LIMIT"} --json-out "$OUTDIR/bench.json" 2>&1 | tee "$OUTDIR/bench.txt" || rc=1

for args in "" "--memory-limit=-1G" "--fail-at 5000"; do
    echo "\$ kvgrant alloc examples/published-dcp8.json --ranks $NGPU --backend cuda $args"
    $KV alloc examples/published-dcp8.json --ranks "$NGPU" --backend cuda $args \
        --trace "$OUTDIR/alloc${args//[^a-z0-9]/_}.ndjson"
    echo "rc=$?"
done 2>&1 | tee "$OUTDIR/cli.txt"
for t in "$OUTDIR"/alloc*.ndjson; do
    $KV conform "$t" --engine python || rc=1
done
exit $rc
