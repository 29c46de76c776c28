#!/usr/bin/env bash
# Here, before a lent GPU's call: what the call must carry to advance a sweep, in the git-ignored runs/gpu/.
#
#   bash scripts/gpu_prepare.sh NAME STORAGE_DIR RESULTS_DIR     # NAME: the protocol's name
#
# STORAGE_DIR holds the sweep's optuna.db and mlflow.db, RESULTS_DIR/NAME its tables and manifest. Made:
# the stores as the call's copy (runs/gpu/stores.tgz: those, results under results/NAME; gzip halves the
# databases, and the 64 MiB a call carries hold the checkout, wheels, data and stores), the datasets'
# published files (DATASETS, default "omniglot", from $DMLBENCH_DATA or ../shared/data) in runs/gpu/data/,
# and the wheels the machine lacks in .whl (`scripts/gpu_wheels.sh`, once).
# A run kept in checkpoints/NAME (results in STORAGE_DIR/results) carries no copy: the checkpoint travels in
# the checkout, a copy beside it would not fit, and the call restores it (runs/gpu/stores.from names it);
# where the stores went on since it was taken (`scripts/stores_pack.py same`), it is refreshed from them
# first, and refused where they are behind it.
# Named datasets only: a `folder:` dataset is read beside its protocol file, so both travel together in the
# checkout or in runs/gpu. Stop the sweep's workers here first (refused while they write): the records that
# come back replace these databases (`scripts/stores_pack.py unpack` refuses if they moved on).
# Then, in one call carrying `runs/gpu` and `.whl`: `bash scripts/gpu_lease.sh protocols/NAME.yaml 570`.
set -eu
cd "$(dirname "$0")/.."
if [ $# -ne 3 ]; then
    echo "usage: bash scripts/gpu_prepare.sh NAME STORAGE_DIR RESULTS_DIR" >&2
    exit 2
fi
name=$1 storage=$2 results=$3
for f in "$storage/optuna.db" "$storage/mlflow.db" "$results/$name/manifest.json"; do
    [ -f "$f" ] || { echo "gpu_prepare: $f: no such file" >&2; exit 2; }
done
storage=$(cd "$storage" && pwd)
if pgrep -f -- "sqlite:///$storage/optuna.db" >/dev/null; then
    echo "gpu_prepare: workers still write to $storage (pgrep -af $storage): stop them first" >&2
    exit 2
fi
data=${DMLBENCH_DATA:-../shared/data}
rm -rf runs/gpu
mkdir -p runs/gpu/data
ckpt=checkpoints/$name
if [ -f "$ckpt/checkpoint.json" ] && [ "$(cd "$results" && pwd)" = "$storage/results" ]; then
    if ! python3 scripts/stores_pack.py same "$storage" "$ckpt" >/dev/null; then
        # the stores went on since the checkpoint: it follows them (never the other way: stores an earlier
        # session left behind it would throw away what a later one did)
        lacking=$(python3 scripts/stores_pack.py behind "$storage" "$ckpt") || exit 2
        if [ -n "$lacking" ]; then
            echo "gpu_prepare: $storage is behind $ckpt ($lacking): restore the checkpoint first" >&2
            exit 2
        fi
        python3 scripts/stores_pack.py checkpoint "$storage" "$ckpt" || exit 2
        echo "gpu_prepare: $ckpt refreshed from the stores (commit it with the session's work)"
    fi
    echo "$ckpt" >runs/gpu/stores.from
    echo "gpu_prepare: the stores are what $ckpt restores: the call restores it, no copy carried"
else
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/results"
    cp "$storage/optuna.db" "$storage/mlflow.db" "$stage/"
    cp -r "$results/$name" "$stage/results/"
    tar czf runs/gpu/stores.tgz -C "$stage" .
fi
for d in ${DATASETS:-omniglot}; do
    [ -d "$data/$d" ] || { echo "gpu_prepare: $data/$d: no such folder (DMLBENCH_DATA names where the data lie)" >&2; exit 2; }
    cp -r "$data/$d" runs/gpu/data/
done
# a run of many sessions runs one commit's code in every part (checkpoints/NAME/run.env); the call runs this
# checkout's, so say where the package differs from it (the manifest's cell_commits will list both)
if [ -f "checkpoints/$name/run.env" ]; then
    commit=$(sed -n 's/^COMMIT=//p' "checkpoints/$name/run.env")
    git diff --quiet "$commit" HEAD -- bench || echo "gpu_prepare: warning: bench/ here differs from the run's" \
        "commit ${commit:0:12} (git diff ${commit:0:12} HEAD -- bench): the chunk would train with other code"
fi
[ -n "$(ls .whl 2>/dev/null)" ] || bash scripts/gpu_wheels.sh
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
carried=$(du -cb runs/gpu .whl | tail -n 1 | cut -f1)
total=$(( (tree + carried) / 1048576 ))
echo "gpu_prepare: runs/gpu and .whl ready; with the checkout about $total MiB of the 64 a call carries"
[ "$total" -lt 64 ] || { echo "gpu_prepare: too much to carry in one call" >&2; exit 3; }
