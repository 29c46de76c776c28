"""dmlbench: a fair-protocol benchmark for deep metric learning.

The public surface is small on purpose: `bench.registry` (names to losses,
miners and trunks), `bench.metrics` (retrieval and clustering metrics) and
the `dmlbench` command line. Everything else may move between releases.
"""

__version__ = "0.1.0"
