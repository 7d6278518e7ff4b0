#!/usr/bin/env bash
# Re-record the real-GPU trace fixtures in the current trace format, then check each:
# the lifecycle traces (tests/fixtures/h200/*.ndjson, kvgrant.traceformat.LIFECYCLE_VERSION,
# both engines) and the group trace (tests/fixtures/h200/group-published-dcp8-2proc.tgz,
# kvgrant.traceformat.GROUP_VERSION: one process per GPU, Python engine). Run from the repository root on a host with 2 CUDA GPUs (VMM support),
# with kvgrant installed (`pip install -e .`) and Java on PATH for the TLC engine:
#
#   bash tools/record_h200_fixtures.sh            # writes into tests/fixtures/h200/
#   OUT=/tmp/h200 bash tools/record_h200_fixtures.sh
#   PARTS=group bash tools/record_h200_fixtures.sh  # only the group trace (PARTS=lifecycle:
#                                                   # only the lifecycle traces)
#
# Each trace is the one-process allocator (kvgrant.runtime.allocator.allocate) on the
# cuda backend, 2 ranks (one GPU each), layout examples/small*.json run on 2 ranks
# that import each other (`--ranks 2`). The fail-at trace injects
# CUDA_ERROR_OUT_OF_MEMORY at the 30th driver call (a cuMemCreate on rank 0).
# Exit status: non-zero when a recording or a check fails.
set -euo pipefail
OUT=${OUT:-tests/fixtures/h200}
KV=${KVGRANT:-kvgrant}
BACKEND=${BACKEND:-cuda}   # BACKEND=sim OUT=/tmp/x: a dry run of this script without GPUs
ENGINE=${ENGINE:-both}     # ENGINE=python on a GPU host without Java; then run
                           # `kvgrant conform FILE --engine both` where Java is
mkdir -p "$OUT"
export KVGRANT_LEDGER=${KVGRANT_LEDGER:-$(mktemp -d)/ledger.json}  # not the host's ledger

rec() {  # rec NAME GEOMETRY PLAN [extra alloc args...]
    local name=$1 geometry=$2 plan=$3
    shift 3
    rm -f "$OUT/$name.ndjson"
    # --fail-at makes alloc exit 1 (the attempt aborts, as intended)
    "$KV" alloc "$geometry" --ranks 2 --plan "$plan" --backend "$BACKEND" \
        --trace "$OUT/$name.ndjson" "$@" || [ "$#" -gt 0 ]
    "$KV" conform "$OUT/$name.ndjson" --geometry "$geometry" --ranks 2 --engine "$ENGINE"
}

PARTS=${PARTS:-lifecycle group}

rec_group() {  # the group runtime, one process per GPU, published then shut down
    local tmp
    tmp=$(mktemp -d)
    "$KV" alloc examples/published-dcp8.json --ranks 2 --procs 2 --backend "$BACKEND" \
        --trace "$tmp/grp"
    "$KV" conform "$tmp/grp"      # accepted by python: 2 processes, ... events
    tar -czf "$OUT/group-published-dcp8-2proc.tgz" -C "$tmp" grp/rank0.ndjson grp/rank1.ndjson
    rm -rf "$tmp"
}

case " $PARTS " in *" lifecycle "*)
    rec small-packed-2rank examples/small.json packed
    rec small-naive-2rank examples/small.json naive
    rec small-inward-packed-2rank examples/small-inward.json packed
    rec small-packed-2rank-fail-at-30 examples/small.json packed --fail-at 30
esac
case " $PARTS " in *" group "*) rec_group ;; esac

if [ "$BACKEND" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
python3 -c "import sys, importlib.metadata as m; print('python', sys.version.split()[0], 'cuda-bindings', m.version('cuda-bindings'))" || true
date -u +"recorded %Y-%m-%d %H:%M UTC"
