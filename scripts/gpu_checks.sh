#!/usr/bin/env bash
# The checks only a GPU machine can make, in one pass (benchmarks/README.md, "On a GPU" and "GPU
# benchmarks"): the CUDA tests (the training loop under CUDA's sync debug mode among them), the Conv-4 step
# against the plain loop, the ResNet-50 training step in fp32 and bf16, the image loader against that step,
# and trials per hour of one sweep with 1 and 4 workers sharing the GPU. Each part prints its own lines; a
# part that fails is named and the rest still run; the exit code is the number of failed parts. The parts'
# limits add up to 6 minutes.
#
#   bash scripts/gpu_checks.sh [OUT]          # logs to OUT (default: ./gpu-checks)
#   ONLY="cuda_tests workers_per_device" bash scripts/gpu_checks.sh    # these parts alone
#
# Needs torch with CUDA and the project's dependencies importable. Wheels for those the machine lacks may lie
# in ./.whl (`scripts/gpu_wheels.sh` fetches them here; installed with --no-deps into a private folder);
# Omniglot is read from $DMLBENCH_DATA.
set -u
cd "$(dirname "$0")/.."
out=${1:-gpu-checks}
mkdir -p "$out"
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
failed=0
part() {  # part NAME TIMEOUT_S COMMAND...: run, log, time; a failure is counted, not fatal
    local name=$1 limit=$2
    shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    local start=$SECONDS
    echo "== $name: $*"
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local code=$?
    tail -n 25 "$out/$name.log"
    echo "== $name: exit $code in $((SECONDS - start)) s"
    [ "$code" -eq 0 ] || failed=$((failed + 1))
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name(0))"
part cuda_tests 100 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py
part conv4_step 60 python3 benchmarks/bench_step_time.py --device cuda --compare 5 --iterations 200
part resnet50_step 45 python3 benchmarks/bench_trunk_step.py --trunk resnet50 --device cuda --batch 32 \
    --precision fp32 bf16 --repeats 3 --iterations 20 --threads 16
part loader_resnet50 60 python3 benchmarks/bench_loader.py --trunk resnet50 --device cuda --precision bf16 \
    --workers 16 --images 512 --batches 20 --steps 20 --repeats 3
# a CUDA copy of the smoke protocol (every own loss and miner, 160 iterations a cell)
sed 's/^training:/training:\n  device: cuda/' protocols/omniglot-smoke.yaml >"$out/omniglot-smoke-cuda.yaml"
# each worker count sweeps 30 s (the whole smoke sweep takes one worker 60 s: 1 and 4 workers overran 90 s)
part workers_per_device 110 python3 scripts/workers_per_device.py --protocol "$out/omniglot-smoke-cuda.yaml" \
    --workers 1 4 --threads 1 --seconds 30
echo "failed parts: $failed"
exit "$failed"
