"""Losses of dmlbench: one class a file, reached by name through bench.registry.

Every loss is called as ``loss(embeddings, labels, indices_tuple=None)`` and
derives from `bench.losses.base.BenchLoss`; the PML-backed entries live in
`bench.losses.pml_backed`. Nothing is imported here, so that naming a loss
never pays for importing the others (or PML).
"""

__all__: list[str] = []  # reached by name through bench.registry; `base` holds what every loss shares
