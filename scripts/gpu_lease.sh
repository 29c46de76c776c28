#!/usr/bin/env bash
# On a lent GPU, one call: the GPU checks, then the next chunk of a sweep on the stores carried in runs/gpu
# (`scripts/gpu_prepare.sh` made them here), its records packed into $OUT to come back.
#
#   bash scripts/gpu_lease.sh PROTOCOL [SECONDS]      # SECONDS: the call's limit (default 570)
#
# SKIP_CHECKS=1 leaves out the checks (a second call on a warm machine, made without carrying runs/gpu: the
# stores there have moved on with the first chunk, and a carried copy would replace them); the checks' logs go
# to ./gpu-checks, not $OUT, whose 8 returned files are kept for the records. WORKERS (default 8) sweep workers
# share the GPU (`scripts/gpu_chunk.sh`); CHECK=2 runs the finished sweep's budget check instead, and NEXT_S=S
# says a second call of S seconds follows at once on the warm machine: the check plans its seeds over both
# calls (SPAN_S), the second resuming what the first leaves (without it, no seed longer than this call is
# started: the calls are limited to 600 s, and a lease of 900 s has room for a second). Here, afterwards:
# `python3 scripts/stores_pack.py unpack [--no-states] RETURNED_FOLDER STORAGE_DIR` (--no-states where CPU
# workers go on: the states of runs left unfinished here are the GPU's, which they cannot resume).
set -u
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "usage: bash scripts/gpu_lease.sh PROTOCOL [SECONDS]" >&2
    exit 2
fi
proto=$1 limit=${2:-570}
start=$SECONDS
export DMLBENCH_DATA=$PWD/runs/gpu/data
# the stores as scripts/gpu_prepare.sh sent them: a copy (stores.tgz) or the checkpoint to restore (stores.from);
# a warm machine's second call, carrying nothing, finds them where the first call's chunk left them
if [ ! -d runs/gpu/stores ]; then
    if [ -f runs/gpu/stores.tgz ]; then
        mkdir -p runs/gpu/stores && tar xzf runs/gpu/stores.tgz -C runs/gpu/stores || exit 2
    elif [ -f runs/gpu/stores.from ]; then
        python3 scripts/stores_pack.py unpack "$(cat runs/gpu/stores.from)" runs/gpu/stores || exit 2
    else
        echo "gpu_lease: no runs/gpu/stores, stores.tgz or stores.from: carry what scripts/gpu_prepare.sh made" >&2
        exit 2
    fi
fi
if [ -z "${SKIP_CHECKS:-}" ]; then
    bash scripts/gpu_checks.sh gpu-checks
    echo "gpu_lease: the checks took $((SECONDS - start)) s"
fi
left=$((limit - (SECONDS - start)))
SPAN_S=$((left + ${NEXT_S:-0})) WORKERS=${WORKERS:-8} bash scripts/gpu_chunk.sh "$proto" runs/gpu/stores "$left"
