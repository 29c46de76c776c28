# Two entry points (README): `make demo` runs the main job, `make test` the tests.
# Both set themselves up on a fresh machine: a .venv, torch==2.13.0 first (the
# CPU wheel on this machine's disk; an unpinned torch pulls a CUDA build of
# several GB), then the project under the same constraints.

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast docs lint format typecheck crosscheck bench sysdeps clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# omniglot-demo: five classic losses, 2 trials, 3 seeds, each above the untrained trunk (README, "The two
# commands"); one thread, since a 2-core machine with other work is slower with two
demo: $(STAMP)
	$(BIN)/dmlbench run protocols/omniglot-demo.yaml --threads 1

sysdeps:
	bash scripts/system-deps.sh

# the venv and the Debian packages are set up side by side (-j2: pip and apt-get wait mostly on the disk and
# the network); lint and the docs build come first, each quick and naming the line of a broken rule or link;
# mypy (about a minute of one core on a fresh machine, no cache) checks the types beside the tests, niced so
# the tests keep their cores, and its report is printed after theirs; the slowest tests are listed at the
# end: CI's log shows where its time goes (the goal: under 20 minutes)
MAKEFLAGS += -j2

test: $(STAMP) sysdeps
	$(BIN)/ruff check bench tests benchmarks scripts
	$(BIN)/ruff format --check bench tests benchmarks scripts
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	nice -n 10 $(BIN)/mypy bench > $(VENV)/mypy.log 2>&1 & types=$$!; \
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -p no:cacheprovider --durations=25; \
	tests=$$?; wait $$types; typed=$$?; echo "mypy bench:"; cat $(VENV)/mypy.log; \
	[ $$tests -ne 0 ] && exit $$tests; exit $$typed

# the documentation site (mkdocs.yml) into site/: strict, so a broken link, anchor or API reference fails;
# nothing is downloaded while building (no web fonts, no plugin that fetches)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# the fast lane: every test but the `slow` ones (real training, sweeps, PostgreSQL and MLflow servers;
# tests/conftest.py marks them); `make test` stays the whole suite
test-fast: $(STAMP) sysdeps
	$(BIN)/python -m pytest -q -n 2 -p no:cacheprovider -m "not slow and not faults"

lint: $(STAMP)
	$(BIN)/ruff check bench tests benchmarks scripts
	$(BIN)/ruff format --check bench tests benchmarks scripts

# rewrite the tree to the project's format and import order (what `make lint` checks)
format: $(STAMP)
	$(BIN)/ruff check --fix --select I bench tests benchmarks scripts
	$(BIN)/ruff format bench tests benchmarks scripts

# mypy over the package alone ([tool.mypy] in pyproject.toml)
typecheck: $(STAMP)
	$(BIN)/mypy bench

crosscheck: $(STAMP)
	$(BIN)/dmlbench crosscheck

bench: $(STAMP)
	for s in benchmarks/*.py; do $(BIN)/python $$s || exit 1; done

clean:
	rm -rf $(VENV) .cache site
