"""dmlbench: a fair-protocol benchmark for deep metric learning.

The public surface is small on purpose: `bench.registry` (names to losses,
miners and trunks), `bench.metrics` (retrieval and clustering metrics),
`bench.sweep.runner.run_protocol` (a whole sweep), `bench.single_run.train_and_evaluate`
(one training run) and the `dmlbench` command line. Everything else may move
between releases.

The library logs to `logging.getLogger("dmlbench")` and its children and adds
no handler of its own: an application decides where the lines go (the CLI
prints them on stderr).
"""

import logging

__version__ = "0.1.0"  # the one version string: pyproject.toml reads it (dynamic = ["version"])

logging.getLogger("dmlbench").addHandler(logging.NullHandler())
