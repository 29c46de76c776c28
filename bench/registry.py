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
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from bench.errors import BenchError


@dataclass(frozen=True)
class ServedBatch:
    """How big a batch a dataset-level miner serves: at most ``tuple_size x sum(counts)`` samples a step.

    The budget counts samples too, so the validator refuses a miner that
    would serve more than P x K, and refuses searching ``counts``.
    """

    counts: tuple[str, ...]  # constructor parameters whose sum is the tuples served per step
    tuple_size: int  # samples per tuple
    tuple_size_if: tuple[str, Any, int] | None = None  # (parameter, value, size): another tuple kind's size

    def size(self, params: dict[str, Any]) -> int:
        """Samples per tuple under these parameter values."""
        if self.tuple_size_if is not None and params.get(self.tuple_size_if[0]) == self.tuple_size_if[1]:
            return self.tuple_size_if[2]
        return self.tuple_size


@dataclass(frozen=True)
class Entry:
    """One method or trunk: where its code is, what it exchanges, and what the planner must know of it."""

    name: str
    kind: str  # "loss" | "miner" | "trunk"
    target: str  # "module:attribute"
    summary: str
    counterpart: str  # the PML class and settings that make it equal, or how it is checked
    tuples: str  # losses: what they consume; miners: what they produce
    search_space: dict[str, dict[str, Any]] = field(default_factory=dict)
    needs: tuple[str, ...] = ()  # build-time context: "num_classes", "embedding_size"
    pml_backed: bool = False
    # miners: "batch" mines inside each P x K batch; "dataset" builds its own batch from the training set
    # (a constructor parameter `dataset_level`, where the class has one, switches it per protocol)
    scope: Literal["batch", "dataset"] = "batch"
    # miners: loss parameters their tuples override (MargOHNM's adaptive margins): never searched on the loss
    supplies: tuple[str, ...] = ()
    batch: ServedBatch | None = None  # dataset-level miners: the batch they serve
    # images embedded without gradient per training step, from (parameters, training images): for the estimate
    embeds_per_step: Callable[[dict[str, Any], float], float] | None = None
    min_classes: int = 2  # classes a P x K batch needs (training.P at least this)
    min_per_class: int = 2  # samples of each class a batch needs (training.K at least this)

    def resolve(self) -> Any:
        """The class or function named by ``target``, imported only now, so that listing the registry
        never imports PML or the other methods."""
        module, attr = self.target.split(":")
        return getattr(importlib.import_module(module), attr)

    def parameters(self) -> dict[str, Any]:
        """Constructor parameters and their defaults (inspect.Parameter.empty where required)."""
        sig = inspect.signature(self.resolve())
        return {
            n: p.default
            for n, p in sig.parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in self.needs
        }

    def settings(self, params: dict[str, Any]) -> dict[str, Any]:
        """The constructor's defaults overridden by ``params``: the values the method will run with."""
        return {**self.parameters(), **params}

    def dataset_level(self, params: dict[str, Any]) -> bool:
        """Whether this miner, with these parameters, builds its own batches from the training set."""
        return bool(self.settings(params).get("dataset_level", self.scope == "dataset"))


def _f(low: float, high: float, log: bool = False) -> dict[str, Any]:
    return {"type": "float", "low": low, "high": high, "log": log}


def _i(low: int, high: int, log: bool = False) -> dict[str, Any]:
    return {"type": "int", "low": low, "high": high, "log": log}


def _c(*choices: Any) -> dict[str, Any]:
    return {"type": "categorical", "choices": list(choices)}


_L = "bench.losses"
_M = "bench.miners"

ENTRIES: tuple[Entry, ...] = (
    # ---- own losses -------------------------------------------------------
    Entry("contrastive", "loss", f"{_L}.contrastive:ContrastiveLoss",
          "Hadsell et al. 2006: pull positives within pos_margin, push negatives beyond neg_margin",
          "pml ContrastiveLoss(pos_margin, neg_margin, distance=LpDistance(power)); form='hadsell' vs loop reference",
          "pairs", {"pos_margin": _f(0.0, 0.5), "neg_margin": _f(0.3, 2.0)}),
    Entry("triplet", "loss", f"{_L}.triplet:TripletLoss",
          "Schroff et al. 2015 / Hermans et al. 2017: [D(a,p) - D(a,n) + margin]_+ or its soft form",
          "pml TripletMarginLoss(margin, smooth_loss)", "triplets", {"margin": _f(0.01, 1.0, log=True)}),
    Entry("quadruplet", "loss", f"{_L}.quadruplet:QuadrupletLoss",
          "Chen et al. 2017: triplet term plus a weaker push between pairs of other classes; optional learned metric",
          "none: loop reference", "quadruplets", {"alpha1": _f(0.6, 2.0), "alpha2": _f(0.05, 0.5)},
          min_classes=3),
    Entry("lifted_structure", "loss", f"{_L}.lifted:LiftedStructureLoss",
          "Song et al. 2016: every positive pair against all negatives of both its ends, O(B^2)",
          "pml LiftedStructureLoss(neg_margin, pos_margin=0)", "pairs", {"scale": _f(1.0, 64.0, log=True)}),
    Entry("npair", "loss", f"{_L}.npair:NPairLoss",
          "Sohn 2016: one positive against every other class's positive, plus an L2 penalty",
          "pml NPairsLoss + LpRegularizer", "npair",
          {"l2_reg": _f(1e-4, 1e-1, log=True), "temperature": _f(0.02, 1.0, log=True)}),
    Entry("infonce", "loss", f"{_L}.infonce:InfoNCELoss",
          "Oord et al. 2018 / SimCLR: supervised NT-Xent over cosine similarities, O(B^2)",
          "pml NTXentLoss(temperature)", "pairs", {"temperature": _f(0.01, 0.5, log=True)}),
    # ---- PML-backed losses (no own implementation) -------------------------
    Entry("pml:multi_similarity", "loss", f"{_L}.pml_backed:MultiSimilarityLoss",
          "Wang et al. 2019 (PML)", "is PML's MultiSimilarityLoss", "pairs",
          {"alpha": _f(0.01, 20.0, log=True), "beta": _f(10.0, 80.0), "base": _f(0.0, 1.0)}, pml_backed=True),
    Entry("pml:margin", "loss", f"{_L}.pml_backed:MarginLoss",
          "Wu et al. 2017 (PML)", "is PML's MarginLoss", "triplets",
          {"margin": _f(0.01, 1.0), "beta": _f(0.5, 1.5)}, pml_backed=True),
    Entry("pml:proxy_anchor", "loss", f"{_L}.pml_backed:ProxyAnchorLoss",
          "Kim et al. 2020 (PML)", "is PML's ProxyAnchorLoss", "proxy",
          {"margin": _f(0.0, 0.5), "alpha": _f(1.0, 64.0, log=True)}, ("num_classes", "embedding_size"), True),
    Entry("pml:arcface", "loss", f"{_L}.pml_backed:ArcFaceLoss",
          "Deng et al. 2019 (PML)", "is PML's ArcFaceLoss", "proxy",
          {"margin": _f(10.0, 60.0), "scale": _f(8.0, 64.0, log=True)}, ("num_classes", "embedding_size"), True),
    Entry("pml:cosface", "loss", f"{_L}.pml_backed:CosFaceLoss",
          "Wang et al. 2018 (PML)", "is PML's CosFaceLoss", "proxy",
          {"margin": _f(0.1, 0.6), "scale": _f(8.0, 64.0, log=True)}, ("num_classes", "embedding_size"), True),
    Entry("pml:supcon", "loss", f"{_L}.pml_backed:SupConLoss",
          "Khosla et al. 2020 (PML)", "is PML's SupConLoss", "pairs",
          {"temperature": _f(0.01, 0.5, log=True)}, pml_backed=True),
    Entry("pml:circle", "loss", f"{_L}.pml_backed:CircleLoss",
          "Sun et al. 2020 (PML)", "is PML's CircleLoss", "pairs",
          {"m": _f(0.1, 0.6), "gamma": _f(16.0, 256.0, log=True)}, pml_backed=True),
    # ---- own miners -------------------------------------------------------
    Entry("batch_all", "miner", f"{_M}.batch_all:BatchAllMiner",
          "Hermans et al. 2017: every valid triplet; reports the fraction with positive loss",
          "pml TripletMarginMiner(type_of_triplets='all', margin=inf)", "triplets"),
    Entry("batch_hard", "miner", f"{_M}.batch_hard:BatchHardMiner",
          "Hermans et al. 2017: per anchor the farthest positive and nearest negative",
          "pml BatchHardMiner()", "triplets"),
    Entry("semihard", "miner", f"{_M}.semihard:SemiHardMiner",
          "Schroff et al. 2015: negatives farther than the positive but within the margin",
          "pml TripletMarginMiner(type_of_triplets='semihard') for semantics='all'; loop reference for 'nearest'",
          "triplets", {"margin": _f(0.01, 1.0, log=True)}),
    Entry("hard", "miner", f"{_M}.hard:HardMiner",
          "negatives nearer than the positive", "pml TripletMarginMiner(type_of_triplets='hard')",
          "triplets"),
    Entry("offline", "miner", f"{_M}.offline:OfflineMiner",
          "FaceNet offline variant: re-embed the training split every n steps, mine globally",
          "none: loop reference", "triplets", {"margin": _f(0.01, 1.0, log=True)},
          scope="dataset", batch=ServedBatch(("triplets_per_batch",), 3),
          embeds_per_step=lambda p, n: min(n, p["subset_size"] or n) / max(1, p["refresh_every"])),
    Entry("hardest_of_pool", "miner", f"{_M}.hardest_of_pool:HardestOfPoolMiner",
          "Craeymeersch: draw a pool of random tuples, keep the hardest plus some random ones",
          "none: loop reference", "quadruplets",
          scope="dataset", batch=ServedBatch(("num_hardest", "num_random"), 4, ("kind", "triplet", 3)),
          embeds_per_step=lambda p, n: 4 * p["pool_size"], min_classes=3),
    Entry("margohnm", "miner", f"{_M}.margohnm:MargOHNMMiner",
          "Chen et al. 2017 sec. 3.3: adaptive margins from batch distance means; keep violating quadruplets",
          "none: loop reference", "quadruplets", {"w1": _f(0.6, 2.0), "w2": _f(0.1, 0.5)},
          supplies=("alpha1", "alpha2"), min_classes=3),
    # ---- PML-backed miners --------------------------------------------------
    Entry("pml:multi_similarity", "miner", f"{_M}.pml_backed:MultiSimilarityMiner",
          "Wang et al. 2019 (PML)", "is PML's MultiSimilarityMiner", "pairs",
          {"epsilon": _f(0.01, 0.5)}, pml_backed=True),
    # ---- trunks ------------------------------------------------------------
    Entry("conv4", "trunk", "bench.models:Conv4", "Vinyals 2016 / Snell 2017 few-shot encoder", "", ""),
    Entry("lecun2006", "trunk", "bench.models:LeCun2006", "Hadsell, Chopra, LeCun 2006 MNIST network", "", ""),
    Entry("omniglot_encoder", "trunk", "bench.models:OmniglotEncoder", "Craeymeersch's Omniglot encoder", "", ""),
    Entry("mlp", "trunk", "bench.models:MLP", "linear layers with ReLU, for vector inputs", "", ""),
)

_BY_KEY = {(e.kind, e.name): e for e in ENTRIES}


def names(kind: str) -> list[str]:
    """The registered names of one kind, in table order."""
    return [e.name for e in ENTRIES if e.kind == kind]


def get(kind: str, name: str) -> Entry:
    """The entry of a name; an unknown name is a BenchError listing the known ones."""
    try:
        return _BY_KEY[(kind, name)]
    except KeyError:
        raise BenchError(f"unknown {kind} {name!r}: expected one of {', '.join(names(kind))}") from None


def check_params(entry: Entry, params: dict[str, Any]) -> None:
    """Refuse unknown parameter names before building, naming the allowed ones."""
    allowed = entry.parameters()
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise BenchError(
            f"{entry.kind} {entry.name!r} has no parameter {', '.join(map(repr, unknown))}: "
            f"expected some of {', '.join(allowed) or '(none)'}"
        )


def _build(kind: str, name: str, params: dict[str, Any], context: dict[str, Any] | None = None) -> Any:
    entry = get(kind, name)
    check_params(entry, params)
    context = context or {}
    missing = [n for n in entry.needs if n not in context]
    if missing:
        raise BenchError(f"{kind} {name!r} needs {', '.join(missing)} to be built")
    try:
        return entry.resolve()(**params, **{n: context[n] for n in entry.needs})
    except (ValueError, TypeError) as e:
        raise BenchError(f"{kind} {name!r}: {e}") from e


def build_loss(name: str, context: dict[str, Any] | None = None, **params: Any) -> Any:
    """A module called as ``loss(embeddings, labels, indices_tuple=None)``."""
    return _build("loss", name, params, context)


def build_miner(name: str, context: dict[str, Any] | None = None, **params: Any) -> Any:
    """A callable ``miner(embeddings, labels)`` returning an index tuple (see bench.tuples)."""
    return _build("miner", name, params, context)


def build_trunk(name: str, **params: Any) -> Any:
    """A trunk module; ``in_shape`` and ``embedding_dim`` come with ``params``."""
    return _build("trunk", name, params)
