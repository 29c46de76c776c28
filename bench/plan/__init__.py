"""The plan of a protocol: its cells (loss x miner), the pairs dropped and why, the budget, the time it takes.

`plan(protocol)` expands the grid (`grid`); the types live in `types`, which
imports nothing of the sweep; the time estimate in `cost`, and the optional
timing of each cell's loss and miner in `method_cost`. `dmlbench plan`
renders a plan as text (`bench.commands.plan`).
"""

from bench.plan.grid import NOT_SELECTED, cell_digest, plan
from bench.plan.types import EVALUATIONS, Budget, Cell, Dropped, Estimate, Plan, TrunkCost, cell_key, trained_cell

__all__ = [
    "EVALUATIONS",
    "NOT_SELECTED",
    "Budget",
    "Cell",
    "Dropped",
    "Estimate",
    "Plan",
    "TrunkCost",
    "cell_digest",
    "cell_key",
    "plan",
    "trained_cell",
]
