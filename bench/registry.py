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
import re
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
    # where the code came from: "built-in", "pml" (generic adapter), "entry point <package>", "--plugin <file>"
    source: str = "built-in"
    version: str = ""  # the plugin package's version (entry points)
    source_hash: str = ""  # sha256 of the module file that defines it (plugins)
    # what `dmlbench crosscheck` compares it with: a registry name ("pml:TripletMarginLoss") or a callable
    # taking the same parameters and returning the reference module
    reference: Any = None

    @property
    def plugin(self) -> bool:
        """Code from outside bench/ and PML: recorded with every run and folded into the protocol hash."""
        return self.source not in ("built-in", "pml", "timm")

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
    Entry(
        "contrastive",
        "loss",
        f"{_L}.contrastive:ContrastiveLoss",
        "Hadsell et al. 2006: pull positives within pos_margin, push negatives beyond neg_margin",
        "pml ContrastiveLoss(pos_margin, neg_margin, distance=LpDistance(power)); form='hadsell' vs loop reference",
        "pairs",
        {"pos_margin": _f(0.0, 0.5), "neg_margin": _f(0.3, 2.0)},
    ),
    Entry(
        "triplet",
        "loss",
        f"{_L}.triplet:TripletLoss",
        "Schroff et al. 2015 / Hermans et al. 2017: [D(a,p) - D(a,n) + margin]_+ or its soft form",
        "pml TripletMarginLoss(margin, smooth_loss)",
        "triplets",
        {"margin": _f(0.01, 1.0, log=True)},
    ),
    Entry(
        "quadruplet",
        "loss",
        f"{_L}.quadruplet:QuadrupletLoss",
        "Chen et al. 2017: triplet term plus a weaker push between pairs of other classes; optional learned metric",
        "none: loop reference",
        "quadruplets",
        {"alpha1": _f(0.6, 2.0), "alpha2": _f(0.05, 0.5)},
        min_classes=3,
    ),
    Entry(
        "lifted_structure",
        "loss",
        f"{_L}.lifted:LiftedStructureLoss",
        "Song et al. 2016: every positive pair against all negatives of both its ends, O(B^2)",
        "pml LiftedStructureLoss(neg_margin, pos_margin=0)",
        "pairs",
        {"scale": _f(1.0, 64.0, log=True)},
    ),
    Entry(
        "npair",
        "loss",
        f"{_L}.npair:NPairLoss",
        "Sohn 2016: one positive against every other class's positive, plus an L2 penalty",
        "pml NPairsLoss + LpRegularizer",
        "npair",
        {"l2_reg": _f(1e-4, 1e-1, log=True), "temperature": _f(0.02, 1.0, log=True)},
    ),
    Entry(
        "infonce",
        "loss",
        f"{_L}.infonce:InfoNCELoss",
        "Oord et al. 2018 / SimCLR: supervised NT-Xent over cosine similarities, O(B^2)",
        "pml NTXentLoss(temperature)",
        "pairs",
        {"temperature": _f(0.01, 0.5, log=True)},
    ),
    # ---- PML-backed losses (no own implementation) -------------------------
    Entry(
        "pml:multi_similarity",
        "loss",
        f"{_L}.pml_backed:MultiSimilarityLoss",
        "Wang et al. 2019 (PML)",
        "is PML's MultiSimilarityLoss",
        "pairs",
        {"alpha": _f(0.01, 20.0, log=True), "beta": _f(10.0, 80.0), "base": _f(0.0, 1.0)},
        pml_backed=True,
    ),
    Entry(
        "pml:margin",
        "loss",
        f"{_L}.pml_backed:MarginLoss",
        "Wu et al. 2017 (PML)",
        "is PML's MarginLoss",
        "triplets",
        {"margin": _f(0.01, 1.0), "beta": _f(0.5, 1.5)},
        ("num_classes",),  # a learned beta per class (per_class) has one row per training class
        pml_backed=True,
    ),
    Entry(
        "pml:proxy_anchor",
        "loss",
        f"{_L}.pml_backed:ProxyAnchorLoss",
        "Kim et al. 2020 (PML)",
        "is PML's ProxyAnchorLoss",
        "proxy",
        {"margin": _f(0.0, 0.5), "alpha": _f(1.0, 64.0, log=True)},
        ("num_classes", "embedding_size"),
        True,
    ),
    Entry(
        "pml:arcface",
        "loss",
        f"{_L}.pml_backed:ArcFaceLoss",
        "Deng et al. 2019 (PML)",
        "is PML's ArcFaceLoss",
        "proxy",
        {"margin": _f(10.0, 60.0), "scale": _f(8.0, 64.0, log=True)},
        ("num_classes", "embedding_size"),
        True,
    ),
    Entry(
        "pml:cosface",
        "loss",
        f"{_L}.pml_backed:CosFaceLoss",
        "Wang et al. 2018 (PML)",
        "is PML's CosFaceLoss",
        "proxy",
        {"margin": _f(0.1, 0.6), "scale": _f(8.0, 64.0, log=True)},
        ("num_classes", "embedding_size"),
        True,
    ),
    Entry(
        "pml:proxy_nca",
        "loss",
        f"{_L}.pml_backed:ProxyNCALoss",
        "Movshovitz-Attias et al. 2017 (PML); lr: the proxies' own learning rate",
        "is PML's ProxyNCALoss",
        "proxy",
        {"softmax_scale": _f(1.0, 100.0, log=True), "lr": _f(1e-6, 1.0, log=True)},
        ("num_classes", "embedding_size"),
        True,
    ),
    Entry(
        "pml:normalized_softmax",
        "loss",
        f"{_L}.pml_backed:NormalizedSoftmaxLoss",
        "Zhai and Wu 2018 (PML); lr: the class weights' own learning rate",
        "is PML's NormalizedSoftmaxLoss",
        "proxy",
        {"temperature": _f(0.01, 1.0, log=True), "lr": _f(1e-6, 1.0, log=True)},
        ("num_classes", "embedding_size"),
        True,
    ),
    Entry(
        "pml:soft_triple",
        "loss",
        f"{_L}.pml_backed:SoftTripleLoss",
        "Qian et al. 2019 (PML); lr: the centres' own learning rate",
        "is PML's SoftTripleLoss (+ SparseCentersRegularizer at reg_weight)",
        "proxy",
        {
            "la": _f(1.0, 100.0),
            "gamma": _f(0.01, 100.0, log=True),
            "margin": _f(0.0, 1.0),
            "reg_weight": _f(0.0, 1.0),
            "lr": _f(1e-6, 1.0, log=True),
        },
        ("num_classes", "embedding_size"),
        True,
    ),
    Entry(
        "pml:fast_ap",
        "loss",
        f"{_L}.pml_backed:FastAPLoss",
        "Cakir et al. 2019 (PML): a histogram approximation of average precision",
        "is PML's FastAPLoss",
        "pairs",
        {"num_bins": _i(2, 100)},
        pml_backed=True,
    ),
    Entry(
        "pml:snr_contrastive",
        "loss",
        f"{_L}.pml_backed:SNRContrastiveLoss",
        "Yuan et al. 2019 (PML): contrastive loss on signal-to-noise ratios",
        "is PML's SignalToNoiseRatioContrastiveLoss (+ ZeroMeanRegularizer at regularizer_weight)",
        "pairs",
        {"pos_margin": _f(0.0, 1.0), "neg_margin": _f(0.0, 2.0), "regularizer_weight": _f(0.0, 1.0)},
        pml_backed=True,
    ),
    Entry(
        "pml:supcon",
        "loss",
        f"{_L}.pml_backed:SupConLoss",
        "Khosla et al. 2020 (PML)",
        "is PML's SupConLoss",
        "pairs",
        {"temperature": _f(0.01, 0.5, log=True)},
        pml_backed=True,
    ),
    Entry(
        "pml:circle",
        "loss",
        f"{_L}.pml_backed:CircleLoss",
        "Sun et al. 2020 (PML)",
        "is PML's CircleLoss",
        "pairs",
        {"m": _f(0.1, 0.6), "gamma": _f(16.0, 256.0, log=True)},
        pml_backed=True,
    ),
    # ---- own miners -------------------------------------------------------
    Entry(
        "batch_all",
        "miner",
        f"{_M}.batch_all:BatchAllMiner",
        "Hermans et al. 2017: every valid triplet; reports the fraction with positive loss",
        "pml TripletMarginMiner(type_of_triplets='all', margin=inf)",
        "triplets",
    ),
    Entry(
        "batch_hard",
        "miner",
        f"{_M}.batch_hard:BatchHardMiner",
        "Hermans et al. 2017: per anchor the farthest positive and nearest negative",
        "pml BatchHardMiner()",
        "triplets",
    ),
    Entry(
        "semihard",
        "miner",
        f"{_M}.semihard:SemiHardMiner",
        "Schroff et al. 2015: negatives farther than the positive but within the margin",
        "pml TripletMarginMiner(type_of_triplets='semihard') for semantics='all'; loop reference for 'nearest'",
        "triplets",
        {"margin": _f(0.01, 1.0, log=True)},
    ),
    Entry(
        "hard",
        "miner",
        f"{_M}.hard:HardMiner",
        "negatives nearer than the positive",
        "pml TripletMarginMiner(type_of_triplets='hard')",
        "triplets",
    ),
    Entry(
        "offline",
        "miner",
        f"{_M}.offline:OfflineMiner",
        "FaceNet offline variant: re-embed the training split every n steps, mine globally",
        "none: loop reference",
        "triplets",
        {"margin": _f(0.01, 1.0, log=True)},
        scope="dataset",
        batch=ServedBatch(("triplets_per_batch",), 3),
        embeds_per_step=lambda p, n: min(n, p["subset_size"] or n) / max(1, p["refresh_every"]),
    ),
    Entry(
        "hardest_of_pool",
        "miner",
        f"{_M}.hardest_of_pool:HardestOfPoolMiner",
        "Craeymeersch: draw a pool of random tuples, keep the hardest plus some random ones",
        "none: loop reference",
        "quadruplets",
        scope="dataset",
        batch=ServedBatch(("num_hardest", "num_random"), 4, ("kind", "triplet", 3)),
        embeds_per_step=lambda p, n: 4 * p["pool_size"],
        min_classes=3,
    ),
    Entry(
        "margohnm",
        "miner",
        f"{_M}.margohnm:MargOHNMMiner",
        "Chen et al. 2017 sec. 3.3: adaptive margins from batch distance means; keep violating quadruplets",
        "none: loop reference",
        "quadruplets",
        {"w1": _f(0.6, 2.0), "w2": _f(0.1, 0.5)},
        supplies=("alpha1", "alpha2"),
        min_classes=3,
    ),
    # ---- PML-backed miners --------------------------------------------------
    Entry(
        "pml:multi_similarity",
        "miner",
        f"{_M}.pml_backed:MultiSimilarityMiner",
        "Wang et al. 2019 (PML)",
        "is PML's MultiSimilarityMiner",
        "pairs",
        {"epsilon": _f(0.01, 0.5)},
        pml_backed=True,
    ),
    # ---- trunks ------------------------------------------------------------
    Entry("conv4", "trunk", "bench.models:Conv4", "Vinyals 2016 / Snell 2017 few-shot encoder", "", ""),
    Entry("lecun2006", "trunk", "bench.models:LeCun2006", "Hadsell, Chopra, LeCun 2006 MNIST network", "", ""),
    Entry("omniglot_encoder", "trunk", "bench.models:OmniglotEncoder", "Craeymeersch's Omniglot encoder", "", ""),
    Entry("mlp", "trunk", "bench.models:MLP", "linear layers with ReLU, for vector inputs", "", ""),
    Entry(
        "resnet18",
        "trunk",
        "bench.models.backbones:resnet18",
        "He et al. 2016, torchvision's ResNet-18 without classifier, a linear embedding head",
        "",
        "",
    ),
    Entry(
        "resnet50",
        "trunk",
        "bench.models.backbones:resnet50",
        "He et al. 2016, torchvision's ResNet-50 without classifier, a linear embedding head",
        "",
        "",
    ),
    Entry(
        "bninception",
        "trunk",
        "bench.models.bninception:bninception",
        "Ioffe and Szegedy 2015, BN-Inception as Cadene's pretrainedmodels names it (the Reality Check's trunk), "
        "a linear embedding head; BGR 0-255 input (data.augment step BNInceptionInput)",
        "",
        "",
    ),
)

_BY_KEY = {(e.kind, e.name): e for e in ENTRIES}


KINDS = ("loss", "miner", "trunk")
TUPLE_KINDS = ("pairs", "triplets", "quadruplets", "npair", "proxy")  # what `tuples` may say (COMPATIBLE below)
TUPLES_ATTRIBUTE = "tuples"  # the class attribute an entry-point loss or miner without `register` declares them in
_REGISTERED: dict[tuple[str, str], Entry] = {}  # entries from `register` (plugins), by (kind, name)
_PLUGIN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")  # no ":" ("pml:" is PML's); safe in an MLflow tag key


def register(
    kind: str,
    name: str,
    *,
    tuples: str = "",
    summary: str = "",
    counterpart: str = "",
    search_space: dict[str, dict[str, Any]] | None = None,
    needs: tuple[str, ...] = (),
    scope: Literal["batch", "dataset"] = "batch",
    supplies: tuple[str, ...] = (),
    batch: ServedBatch | None = None,
    embeds_per_step: Callable[[dict[str, Any], float], float] | None = None,
    min_classes: int = 2,
    min_per_class: int = 2,
    reference: Any = None,
) -> Callable[[Any], Any]:
    """Add a loss, miner or trunk to the registry without editing bench/: decorate its class or factory.

    The fields are those of `Entry` (what the planner and validator need);
    ``tuples`` is what a loss consumes or a miner produces (`TUPLE_KINDS`): a
    loss that ignores ``indices_tuple`` (learns from the labels alone, as a
    proxy loss does) declares ``"proxy"``, which `incompatibility` pairs with
    no miner, so it runs only with ``none``;
    the class must be importable by its module and name, which an installed
    package or a ``--plugin`` file is. A name taken by another entry is refused.
    """
    if kind not in KINDS:
        raise BenchError(f"register: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not isinstance(name, str) or not _PLUGIN_NAME.match(name):
        raise BenchError(f"register: {kind} name {name!r} must be a letter then letters, digits, '_', '.' or '-'")
    if kind != "trunk" and not tuples:
        raise BenchError(f"register: {kind} {name!r} must declare tuples= ({', '.join(TUPLE_KINDS)})")

    def decorate(obj: Any) -> Any:
        from bench import plugins

        origin = plugins.current_origin(obj.__module__)
        entry = Entry(
            name,
            kind,
            f"{obj.__module__}:{obj.__qualname__}",
            summary or (obj.__doc__ or "").strip().split("\n")[0],
            counterpart,
            tuples,
            dict(search_space or {}),
            tuple(needs),
            scope=scope,
            supplies=tuple(supplies),
            batch=batch,
            embeds_per_step=embeds_per_step,
            min_classes=min_classes,
            min_per_class=min_per_class,
            source=origin.source,
            version=origin.version,
            source_hash=plugins.file_sha256(obj),
            reference=reference,
        )
        _check_search_space(entry, obj)
        old = _BY_KEY.get((kind, name)) or _REGISTERED.get((kind, name))
        if old is not None and old.target != entry.target:
            raise BenchError(
                f"register: {kind} {name!r} is already {old.target} ({old.source}); {entry.target} cannot take the name"
            )
        _REGISTERED[(kind, name)] = entry
        return obj

    return decorate


def _check_search_space(entry: Entry, obj: Any) -> None:
    """A search space may only name parameters the class takes: a name it lacks would fail every trial of
    every sweep that uses the method, after the budget was spent, so it is refused when it is registered."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: nothing to check against
        return
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return  # takes any keyword: the class decides at build time
    taken = {n for n, p in sig.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    unknown = sorted(set(entry.search_space) - taken)
    if unknown:
        raise BenchError(
            f"register: {entry.kind} {entry.name!r}: search_space names {', '.join(map(repr, unknown))}, "
            f"which {entry.target} does not take (its parameters: {', '.join(sorted(taken)) or 'none'})"
        )


def names(kind: str) -> list[str]:
    """The known names of one kind: built-ins in table order, then registered and installed plugins."""
    from bench import plugins

    out = [e.name for e in ENTRIES if e.kind == kind]
    out += [n for k, n in _REGISTERED if k == kind and n not in out]
    return out + sorted(n for n in plugins.entry_points(kind) if n not in out)


def entries(kind: str | None = None) -> list[Entry]:
    """Every entry (of ``kind``), installed plugins imported: for listing and cross-checking."""
    from bench import plugins

    for k in [kind] if kind else KINDS:
        for name in plugins.entry_points(k):
            if (k, name) not in _BY_KEY:
                get(k, name)
    return [e for e in (*ENTRIES, *_REGISTERED.values()) if not kind or e.kind == kind]


def loaded_plugins() -> list[Entry]:
    """The plugin entries registered in this process so far (installed ones only once looked up)."""
    return [e for e in _REGISTERED.values() if e.plugin]


def get(kind: str, name: str) -> Entry:
    """The entry of a name; an unknown name is a BenchError listing the known ones.

    Looked up in the built-in table, then among registered plugins, then as
    a PML class (``pml:ClassName``), then among installed entry points, which
    are imported here, on their first lookup.
    """
    entry = _BY_KEY.get((kind, name)) or _REGISTERED.get((kind, name))
    if entry is not None:
        return entry
    if name.startswith("pml:") and kind in ("loss", "miner"):
        return _pml_entry(kind, name)
    if name.startswith("timm:") and kind == "trunk":
        return _timm_entry(name)
    from bench import plugins

    ep = plugins.entry_points(kind).get(name) if kind in plugins.GROUPS else None
    if ep is not None:
        obj = plugins.load_entry_point(kind, ep)
        entry = _REGISTERED.get((kind, name))
        if entry is None:
            entry = _entry_point_entry(kind, name, ep, obj)
            _REGISTERED[(kind, name)] = entry
        return entry
    dynamic = "timm:<timm model name>" if kind == "trunk" else "pml:<PML class name>"
    raise BenchError(
        f"unknown {kind} {name!r}: expected one of {', '.join(names(kind))}, or {dynamic} "
        "(a plugin's name needs its package installed or `dmlbench --plugin FILE` before the command)"
    )


def _entry_point_entry(kind: str, name: str, ep: Any, obj: Any) -> Entry:
    """The entry of an installed entry point that names its class (or factory) itself, without `register`.

    As with pytest's or MLflow's entry points, the object named is the
    method, under the entry point's name; its parameters come from its
    signature (``num_classes``/``embedding_size`` are supplied at build time,
    as for PML's classes). What a signature cannot say: a loss's or miner's
    tuple kind, read from its class attribute ``tuples`` (refused, in one
    line saying what to add, when absent); a search space, tuples' sizes and
    the rest stay with `register`.
    """
    from bench import plugins

    where = f"plugin {ep.value!r} ({plugins.GROUPS[kind]} entry point {name!r})"
    if not _PLUGIN_NAME.match(name):
        raise BenchError(f"{where}: the name {name!r} must be a letter then letters, digits, '_', '.' or '-'")
    if not callable(obj):
        raise BenchError(
            f"{where} names a {type(obj).__name__}, not a {kind} class: name the class, or "
            f"decorate it with bench.registry.register({kind!r}, {name!r}, ...)"
        )
    tuples = ""
    if kind != "trunk":
        tuples = getattr(obj, TUPLES_ATTRIBUTE, "")
        verb = "consumes" if kind == "loss" else "produces"
        if not tuples:
            raise BenchError(
                f"{where}: say which tuples the {kind} {verb}: add a class attribute "
                f'{TUPLES_ATTRIBUTE} = "pairs" (or {", ".join(TUPLE_KINDS[1:])}) to {ep.attr}, or '
                f"decorate it with bench.registry.register({kind!r}, {name!r}, tuples=...)"
            )
        if tuples not in TUPLE_KINDS:
            raise BenchError(
                f"{where}: {ep.attr}.{TUPLES_ATTRIBUTE} is {tuples!r}: expected one of {', '.join(TUPLE_KINDS)}"
            )
    try:
        taken = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        taken = {}  # type: ignore[assignment]
    needs = tuple(n for n in ("num_classes", "embedding_size") if kind != "trunk" and n in taken)
    package, version = plugins.entry_point_package(ep)
    summary = (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
    return Entry(
        name,
        kind,
        f"{ep.module}:{ep.attr}",
        summary,
        "",
        str(tuples),
        needs=needs,
        source=f"entry point {package}",
        version=version,
        source_hash=plugins.file_sha256(obj),
    )


def _pml_entry(kind: str, name: str) -> Entry:
    """Any PML loss or miner by its class name, behind the generic adapter; cached like a registered one."""
    module = "bench.losses.pml_backed" if kind == "loss" else "bench.miners.pml_backed"
    adapters = importlib.import_module(module)
    cls_name = name[len("pml:") :]
    adapter = adapters.adapter(cls_name)  # a BenchError for an unknown class or one whose tuples are unknown
    needs = tuple(n for n in ("num_classes", "embedding_size") if n in inspect.signature(adapter).parameters)
    entry = Entry(
        name,
        kind,
        f"{module}:{adapter.__name__}",
        f"PML's {cls_name}, through the generic adapter",
        f"is PML's {cls_name}",
        adapter.tuples,
        needs=needs,
        pml_backed=True,
        source="pml",
    )
    _REGISTERED[(kind, name)] = entry
    return entry


def _timm_entry(name: str) -> Entry:
    """Any timm model as ``timm:<model>``, without its classifier, with an embedding head. Not cached in the
    registered entries (unlike PML's), so `names` lists the built-in trunks only, not every timm name looked up."""
    from bench.models import backbones

    model = name[len("timm:") :]
    backbones.check_timm_name(model)  # a BenchError without timm (how to install it) or for an unknown model
    return Entry(
        name,
        "trunk",
        f"bench.models.backbones:timm_{model}",
        f"timm's {model}, a linear embedding head",
        "",
        "",
        source="timm",
        version=backbones.timm_module().__version__,
    )


def check_params(entry: Entry, params: dict[str, Any]) -> None:
    """Refuse unknown parameter names before building, naming the allowed ones."""
    allowed = entry.parameters()
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise BenchError(
            f"{entry.kind} {entry.name!r} has no parameter {', '.join(map(repr, unknown))}: "
            f"expected some of {', '.join(allowed) or '(none)'}"
        )


def build(kind: str, name: str, params: dict[str, Any], context: dict[str, Any] | None = None) -> Any:
    """The ``kind`` entry ``name`` built with ``params`` and the context values it needs (``entry.needs``);
    unknown parameters and a constructor's ValueError or TypeError are a BenchError naming the entry."""
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
    return build("loss", name, params, context)


def build_miner(name: str, context: dict[str, Any] | None = None, **params: Any) -> Any:
    """A callable ``miner(embeddings, labels)`` returning an index tuple (see bench.tuples)."""
    return build("miner", name, params, context)


def build_trunk(name: str, **params: Any) -> Any:
    """A trunk module; ``in_shape`` and ``embedding_dim`` come with ``params``."""
    return build("trunk", name, params)


# --------------------------------------------------------------------------- loss x miner

# Loss consumes (key) -> miner outputs it can use. Pair and triplet losses
# convert between pairs and triplets (PML's convention, bench.tuples);
# quadruplets carry a type only the quadruplet loss reads; N-pair takes one
# positive pair per class; proxy losses learn from labels alone.
COMPATIBLE: dict[str, frozenset[str]] = {
    "pairs": frozenset({"pairs", "triplets"}),
    "triplets": frozenset({"pairs", "triplets"}),
    "quadruplets": frozenset({"quadruplets"}),
    "npair": frozenset({"pairs"}),
    "proxy": frozenset(),
}


def incompatibility(loss: Entry, miner: Entry | None) -> str | None:
    """Why this loss cannot use this miner's output, or None when it can."""
    if miner is None:
        return None
    produces, consumes = miner.tuples, loss.tuples
    if produces in COMPATIBLE.get(consumes, frozenset()):
        return None
    if consumes in _REFUSAL:
        why = _REFUSAL[consumes]
    elif produces == "quadruplets":
        why = "{miner} produces quadruplets, which only a quadruplet loss consumes; {loss} takes {consumes}"
    else:
        why = "{loss} consumes {consumes}; {miner} produces {produces}"
    return why.format(loss=loss.name, miner=miner.name, produces=produces, consumes=consumes)


# why a loss that consumes these tuples cannot use a miner's other tuples (`incompatibility`)
_REFUSAL = {
    "proxy": "{loss} learns from labels alone (tuples 'proxy': a proxy loss, or any loss that ignores mined "
    "tuples), so {miner}'s {produces} would be ignored",
    "npair": "{loss} takes one positive pair per class (N-pair batches); {miner} produces {produces}",
    "quadruplets": "{loss} needs quadruplets; {miner} produces {produces} (use a quadruplet-capable miner)",
}
