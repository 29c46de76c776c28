# Two entry points (README): `make demo` runs the main job, `make test` the tests.
# Both set themselves up on a fresh machine: a .venv, torch==2.13.0 first (the
# CPU wheel on this machine's disk; an unpinned torch pulls a CUDA build of
# several GB), then the project under the same constraints.

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test typecheck crosscheck bench sysdeps clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dmlbench run protocols/omniglot-smoke.yaml

sysdeps:
	bash scripts/system-deps.sh

# types first: mypy is quick next to the tests and names the line of a broken signature
test: $(STAMP) sysdeps
	$(BIN)/mypy bench
	$(BIN)/python -m pytest -q -n 2 -p no:cacheprovider

# mypy over the package alone ([tool.mypy] in pyproject.toml)
typecheck: $(STAMP)
	$(BIN)/mypy bench

crosscheck: $(STAMP)
	$(BIN)/dmlbench crosscheck

bench: $(STAMP)
	for s in benchmarks/*.py; do $(BIN)/python $$s || exit 1; done

clean:
	rm -rf $(VENV) .cache
