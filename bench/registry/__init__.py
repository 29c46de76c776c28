"""One table from names to implementations: losses, miners and trunks.

Protocol files, the command line and the tests name methods only through
this table, so a protocol can never import arbitrary code. Each entry says
what it consumes or produces (pairs, triplets, quadruplets, proxies), which
the planner uses to drop loss x miner pairs that make no sense, and what
its PML counterpart is, which `dmlbench list` and the cross-check report.

Everything the planner and the validator need to know of a method is on
its entry (`scope`, `supplies`, `batch`, `min_classes`, ...), never in a
list of names elsewhere: a method added here with those fields is planned
and validated like a built-in one.

Implementations are imported lazily: listing names must not pay for
importing PML.

The jobs, one module each: `_entry` (the `Entry` type, search-space
distributions, loss x miner compatibility), `_builtin` (the built-in table),
`_dynamic` (``pml:<Class>`` and ``timm:<model>`` entries), `_lookup`
(lookup and plugin registration), `_build` (building an entry).
"""

from bench.registry._build import build, build_loss, build_miner, build_trunk, check_params
from bench.registry._builtin import ENTRIES
from bench.registry._dynamic import PML_SEARCH_SPACES, PML_WRAPPED, pml_search_space
from bench.registry._entry import (
    COMPATIBLE,
    KINDS,
    TUPLE_KINDS,
    TUPLES_ATTRIBUTE,
    Entry,
    ServedBatch,
    float_space,
    incompatibility,
    int_space,
)
from bench.registry._lookup import entries, get, loaded_plugins, names, register

__all__ = [
    "COMPATIBLE",
    "ENTRIES",
    "KINDS",
    "PML_SEARCH_SPACES",
    "PML_WRAPPED",
    "TUPLES_ATTRIBUTE",
    "TUPLE_KINDS",
    "Entry",
    "ServedBatch",
    "build",
    "build_loss",
    "build_miner",
    "build_trunk",
    "check_params",
    "entries",
    "float_space",
    "get",
    "incompatibility",
    "int_space",
    "loaded_plugins",
    "names",
    "pml_search_space",
    "register",
]
