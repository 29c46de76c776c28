#!/usr/bin/env bash
# The next resumable chunk of a real sweep on a GPU, within one call's time limit (benchmarks/README.md,
# "GPU benchmarks"). The stores travel with the call: STORES_DIR holds optuna.db, mlflow.db and results/
# (created on the first chunk), so carrying the folder there and back and running this again resumes.
#
#   bash scripts/gpu_chunk.sh PROTOCOL STORES_DIR [SECONDS]     # SECONDS: the whole call's limit, default 480
#
# The sweep trains on cuda (`dmlbench run --device cuda`, named in the manifest's device_override; the records
# and hashes are the protocol's own) and is told to stop MARGIN_S (default 60) seconds before SECONDS, for
# the imports, the data and the tables: it claims no trial or final seed that would end past that (by the
# longest it has run), gives back one still running then, and prints what remains. A `timeout` at SECONDS
# is the backstop (SIGTERM: the running trial is given back, exit 130).
# Exit: dmlbench's own: 0 the sweep is done, 4 stopped with work left (run again with the same STORES_DIR),
# 1 done but a cell without a result, 2 bad input, 75 a store unavailable, 130 interrupted; 3 the records
# could not be packed to come back (below).
#
# Coming back: where $OUT is set (the lent machine's return folder; PACK_TO names another), the records this
# chunk wrote are packed there as stores.tgz.00, .01, ... and stores.sha256 (`scripts/stores_pack.py`: parts
# under the 16 MiB a returned file may have; the artifacts too, wherever the experiment keeps them). Here,
# with the sweep's workers stopped since the stores were carried:
#
#   python3 scripts/stores_pack.py unpack RETURNED_FOLDER STORES_DIR
#
# DEVICE=cpu: the same chunk on the CPU (tests/test_gpu_chunk.py checks the script so).
#
# WORKERS=N (default 1) workers share the GPU, started 5 s apart, each with THREADS=T CPU threads (default:
# the cores / N); a small trunk leaves most of the GPU to the others (`scripts/workers_per_device.py`
# measures how many pay).
#
# CHECK=MULTIPLE: the finished run's budget check instead (`dmlbench budget-check --multiple MULTIPLE
# --device cuda`, rows to STORES_DIR/results/<name>/budget_check.csv), told to stop MARGIN_S before SECONDS
# too: it trains the longest seeds that would end by then at the pace this device has recorded and starts
# none that would not (a state left by an unfinished seed only this device and code resume, so a chunk spent
# on seeds longer than it wasted it). SPAN_S (default SECONDS): the chunk time this machine has in this call and
# the calls made at once after it on the same warm machine, which resume the seeds this one leaves; the check
# then plans for SPAN_S and the `timeout` still ends this call at SECONDS. Exit 0: the check is done; 4: work left.
#
# Needs torch with CUDA and the project's dependencies importable; wheels for those the machine lacks may
# lie in ./.whl (as for scripts/gpu_checks.sh); Omniglot is read from $DMLBENCH_DATA.
set -u
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
    echo "usage: bash scripts/gpu_chunk.sh PROTOCOL STORES_DIR [SECONDS]" >&2
    exit 2
fi
proto=$1 stores=$2 limit=${3:-480} margin=${MARGIN_S:-60}
span=${SPAN_S:-$limit}
[ "$span" -ge "$limit" ] || span=$limit
if [ "$limit" -le "$((margin + 30))" ]; then
    echo "gpu_chunk: SECONDS ($limit) must exceed MARGIN_S + 30 ($((margin + 30)))" >&2
    exit 2
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# the wheels only where the project's dependencies are missing (a lent machine's image): not over an environment
# that has them
if compgen -G ".whl/*.whl" >/dev/null && ! python3 -c "import optuna, mlflow, pytorch_metric_learning" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dmlbench-site \
        .whl/*.whl || exit 99
    export PYTHONPATH="/tmp/dmlbench-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
device=${DEVICE:-cuda}  # DEVICE=cpu runs the same chunk on the CPU (how the tests check this script)
if [[ $device == cuda* ]]; then
    python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
        echo "gpu_chunk: no CUDA device here" >&2
        exit 2
    }
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
fi
mkdir -p "$stores"
stores=$(cd "$stores" && pwd)
start=$SECONDS
pack_to=${PACK_TO:-${OUT:-}}
if [ -n "$pack_to" ]; then
    python3 scripts/stores_pack.py stamp "$stores" || exit 2
fi
records=(--storage "sqlite:///$stores/optuna.db" --tracking-uri "$stores/mlflow.db" --results-dir "$stores/results")
workers=${WORKERS:-1}
threads=${THREADS:-$(( $(nproc) / workers > 0 ? $(nproc) / workers : 1 ))}
pids=()
for ((k = 1; k <= workers; k++)); do
    lag=$((5 * (k - 1)))  # a few seconds apart, each still ending by the limit
    if [ -n "${CHECK:-}" ]; then
        timeout --signal=TERM "$((limit - lag))" python3 -m bench.cli budget-check "$proto" --device "$device" \
            --multiple "$CHECK" --shard "$k/$workers" --stop-after "$((span - margin - lag))" --threads "$threads" \
            "${records[@]}" --quiet &
    else
        timeout --signal=TERM "$((limit - lag))" python3 -m bench.cli run "$proto" --device "$device" \
            --stop-after "$((limit - margin - lag))" --threads "$threads" "${records[@]}" --quiet &
    fi
    pids+=($!)
    [ "$k" -lt "$workers" ] && sleep 5
done
done_what="the sweep is done" left=4
[ -n "${CHECK:-}" ] && done_what="the budget check is done"
code=0  # all done: 0; else work left if any worker left some; else the first other failure
for pid in "${pids[@]}"; do
    wait "$pid"
    c=$?
    [ "$c" -eq 124 ] && c=130  # timeout's own status when its signal ended the worker
    # planned past this call (SPAN_S): a seed still training at its end is left for the next call, not lost
    [ "$c" -eq 130 ] && [ "$span" -gt "$limit" ] && c=$left
    if [ "$c" -eq "$left" ] && [ "$code" -eq 0 ]; then
        code=$c
    elif [ "$c" -ne 0 ] && [ "$c" -ne "$left" ] && { [ "$code" -eq 0 ] || [ "$code" -eq "$left" ]; }; then
        code=$c
    fi
done
case $code in
    0) what=$done_what ;;
    "$left") what="stopped with work left: run again with the same STORES_DIR to resume" ;;
    *) what="see above" ;;
esac
echo "gpu_chunk: exit $code in $((SECONDS - start)) s: $what"
if [ -n "$pack_to" ]; then
    python3 scripts/stores_pack.py pack "$stores" "$pack_to" || {
        echo "gpu_chunk: the records of this chunk could not be packed to come back" >&2
        exit 3
    }
fi
exit "$code"
