"""Miners of dmlbench: one class a file, reached by name through bench.registry.

Every miner is called as ``miner(embeddings, labels) -> index tuple`` (see
bench.tuples) and derives from `bench.miners._common.BenchMiner`. Nothing is
imported here, so that naming a miner never pays for importing the others
(or PML).
"""

__all__: list[str] = []  # reached by name through bench.registry
