"""One cell built (`build`): trunk, loss, miner and optimiser groups, with one rule for ``num_classes``."""

from bench.cell.build import (
    HARNESS,
    Recipe,
    build_cell,
    build_methods,
    classes_of,
    method_call,
    method_params,
    optimizer,
    planned_classes,
    protocol_trunk,
)

__all__ = [
    "HARNESS",
    "Recipe",
    "build_cell",
    "build_methods",
    "classes_of",
    "method_call",
    "method_params",
    "optimizer",
    "planned_classes",
    "protocol_trunk",
]
