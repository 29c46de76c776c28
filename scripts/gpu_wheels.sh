#!/usr/bin/env bash
# The wheels a lent GPU machine lacks to run dmlbench, fetched here into ./.whl (git-ignored through
# .git/info/exclude) for `scripts/gpu_checks.sh` and `scripts/gpu_chunk.sh`, which install them there.
#
#   bash scripts/gpu_wheels.sh            # then carry .whl (and the stores, and the data) in the call
#
# The machine's image (PyTorch, numpy, pandas, scipy, scikit-learn, pyyaml, click, tqdm, pillow, ...) has
# no Optuna, MLflow or pytorch-metric-learning; these are those and what they need beyond the image, at the
# versions this checkout's .venv holds, as CPython 3.12 x86-64 wheels (the image's Python). MLflow comes
# as mlflow-skinny: the SQLite tracking store is in it, and the full package's web UI (12 MB) would crowd
# the 64 MiB a call may carry. About 25 MB.
set -eu
cd "$(dirname "$0")/.."
names="alembic annotated-types blinker cachetools cffi colorlog cryptography databricks-sdk docker fastapi
gitdb gitpython google-auth graphql-core huey importlib-metadata itsdangerous jsonschema
jsonschema-specifications mako mlflow-skinny mlflow-tracing opentelemetry-api opentelemetry-proto
opentelemetry-sdk opentelemetry-semantic-conventions optuna prettytable pyasn1 pyasn1-modules pycparser
pydantic pydantic-core python-dotenv pytorch-metric-learning referencing rpds-py smmap sqlalchemy sqlparse
starlette typing-inspection uvicorn wcwidth"
frozen=$(.venv/bin/python -m pip freeze 2>/dev/null | grep '==' || true)
pins=()
for name in $names; do  # the .venv's pin, its name compared in PEP 503's normal form
    line=$(printf '%s\n' "$frozen" | awk -F'==' -v want="$name" \
        '{ n = tolower($1); gsub(/[._]/, "-", n); if (n == want) print $1 "==" $2 }')
    [ -n "$line" ] || { echo "gpu_wheels: $name is not in .venv (run make .venv/.installed first)" >&2; exit 2; }
    pins+=("$line")
done
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${pins[@]}"
echo "gpu_wheels: $(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl"
