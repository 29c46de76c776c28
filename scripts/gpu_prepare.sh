#!/usr/bin/env bash
# Here, before a lent GPU's call: what the call must carry to advance a sweep, in the git-ignored runs/gpu/.
#
#   bash scripts/gpu_prepare.sh NAME STORAGE_DIR RESULTS_DIR     # NAME: the protocol's name
#
# STORAGE_DIR holds the sweep's optuna.db and mlflow.db, RESULTS_DIR/NAME its tables and manifest. Copied:
# those to runs/gpu/stores/ (results under runs/gpu/stores/results/NAME), the datasets' published files
# (DATASETS, default "omniglot", from $DMLBENCH_DATA or ../shared/data) to runs/gpu/data/, and the wheels
# the machine lacks to .whl (`scripts/gpu_wheels.sh`, once). Named datasets only: a `folder:` dataset is
# read beside its protocol file, so both travel together in the checkout or in runs/gpu. Stop the sweep's
# workers here first: the records that come back replace these databases (`scripts/stores_pack.py unpack`
# refuses if they moved on).
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
data=${DMLBENCH_DATA:-../shared/data}
rm -rf runs/gpu
mkdir -p runs/gpu/stores/results runs/gpu/data
cp "$storage/optuna.db" "$storage/mlflow.db" runs/gpu/stores/
cp -r "$results/$name" runs/gpu/stores/results/
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
