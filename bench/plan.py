"""A protocol's grid expanded into cells, the pairs dropped and why, and the budget.

A cell is one loss with one miner (or none). Pairs that make no sense are
dropped by what the registry says each method consumes and produces
(`Entry.tuples`), a miner's scope (`Entry.dataset_level`) and the loss
parameters its tuples supply (`Entry.supplies`, removed from the cell's
search space) come from its entry too, never from a hand-kept list of
names, so a new method is planned correctly from its registry entry alone. Every cell gets the same
budget by construction; `Budget` is also what the results audit compares
the recorded runs against.

The time estimate uses the per-trunk costs in `TRUNK_COSTS`, measured on
this project's reference machine (2 CPU cores), or `GPU_TRUNK_COSTS` for a
protocol that trains on CUDA (then it is GPU-hours), scaled by batch size
and pixels; a step time measured on one's own device (`--step-ms`,
from `benchmarks/bench_trunk_step.py`) replaces the table. It is an
estimate to decide whether a sweep fits an afternoon or a GPU allocation,
not a promise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from bench import registry
from bench.clock import hms
from bench.errors import BenchError
from bench.protocol import NO_MINER, Protocol
from bench.protocol.load import method_params
from bench.protocol.schema import image_hw

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


NOT_SELECTED = "not selected by the protocol (the loss's `miners` list)"


@dataclass(frozen=True)
class TrunkCost:
    """Seconds per training step at the reference size, and per embedded image (no gradient)."""

    step_s: tuple[float, float]  # (low, high) at ref_batch and ref_pixels
    embed_s: float  # per image at ref_pixels
    ref_batch: int = 128
    ref_pixels: int = 28 * 28
    ref_hw: tuple[int, int] | None = None  # the measured image's height and width, when not square
    measured: bool = True
    source: str = ""  # where the figure comes from, printed beside the estimate


# One place for the machine's speed. conv4 and mlp are measured here (Conv-4 at
# 28x28, batch 128: 75-135 ms a step; MLP on 784-d: 2-4 ms; embedding Omniglot's
# 13,180 evaluation images with Conv-4: about 8 s). The others are scaled by
# their multiply-adds relative to Conv-4 and marked as not measured.
TRUNK_COSTS: dict[str, TrunkCost] = {
    "conv4": TrunkCost((0.075, 0.135), 8.0 / 13180),
    "mlp": TrunkCost((0.002, 0.004), 0.1 / 13180),
    "lecun2006": TrunkCost((0.010, 0.025), 1.5 / 13180, measured=False),
    "omniglot_encoder": TrunkCost((0.300, 0.600), 30.0 / 13180, measured=False),
}
UNKNOWN_TRUNK = TrunkCost((0.075, 0.135), 8.0 / 13180, measured=False)
# ResNets at 224x224, batch 32, bf16 + channels-last, one thread. ResNet-50 measured here by
# benchmarks/bench_trunk_step.py (3.2 s of CPU a step at 227x227, embedding ~0.09 s an image in fp32,
# on a loaded machine: the range allows for it); ResNet-18 scaled by multiply-adds (1.8 / 4.1 G).
TRUNK_COSTS.update({
    "resnet18": TrunkCost((1.3, 2.0), 0.04, ref_batch=32, ref_pixels=224 * 224, measured=False,
                          source="not measured: scaled from ResNet-50"),
    "resnet50": TrunkCost((3.0, 4.5), 0.09, ref_batch=32, ref_pixels=224 * 224),
})
# On one GPU. Conv-4 measured on an H100 (benchmarks/bench_step_time.py: 8.0-8.5 ms at batch 128,
# 13,180 images embedded in 0.04 s). The ResNets are not measured here (no GPU was lent when
# they were added): eager PyTorch trains a ResNet-50 at about 1,000-1,600 images/s in bf16 on
# one A100/H100-class GPU, i.e. 20-32 ms for a batch of 32 at 224x224; pass a measured
# `--step-ms` for a real figure.
_GPU_GUESS = "not measured: published eager-PyTorch throughput; pass --step-ms from benchmarks/bench_trunk_step.py"
GPU_TRUNK_COSTS: dict[str, TrunkCost] = {
    "conv4": TrunkCost((0.0080, 0.0085), 0.04 / 13180, source="measured on an H100"),
    "resnet18": TrunkCost((0.008, 0.014), 0.0002, ref_batch=32, ref_pixels=224 * 224, measured=False,
                          source=_GPU_GUESS),
    "resnet50": TrunkCost((0.020, 0.032), 0.0005, ref_batch=32, ref_pixels=224 * 224, measured=False,
                          source=_GPU_GUESS),
}
UNKNOWN_GPU_TRUNK = GPU_TRUNK_COSTS["resnet50"]

# Images per class and classes per named dataset: eval cost without loading data.
DATASET_SIZES: dict[str, tuple[int, float]] = {  # spec -> (classes, images per class)
    "omniglot:background": (964, 20),
    "omniglot:evaluation": (659, 20),
    "fashion-mnist:train": (10, 6000),
    "fashion-mnist:test": (10, 1000),
    # the published splits (METHODS.md): images / classes
    "cub200:train": (100, 58.64),
    "cub200:test": (100, 59.24),
    "cars196:train": (98, 8054 / 98),
    "cars196:test": (98, 8131 / 98),
    "sop:train": (11318, 59551 / 11318),
    "sop:test": (11316, 60502 / 11316),
    "inshop:train": (3997, 25882 / 3997),
    "inshop:query": (3985, 14218 / 3985),
    "inshop:gallery": (3985, 12612 / 3985),
    "market1501:train": (751, 12936 / 751),
    "market1501:query": (750, 3368 / 750),
    "market1501:gallery": (752, 19732 / 752),  # 750 test identities, distractors (0) and junk (-1)
}
OVERHEAD_S_PER_RUN = 0.4  # MLflow and Optuna records per training run (SQLite)
STEP_FIXED_S = 0.005  # per step whatever the batch: optimiser, loss and miner calls (measured: small batches)
# Metrics on N embeddings (measured here, 64-d): retrieval is O(N^2), 2.1 s at
# N = 13,180; k-means for NMI/AMI is O(N x classes x iterations), 85 s at
# N = 13,180 and 659 classes, 0.5 s at 4,800 and 240.
RETRIEVAL_S_PER_PAIR = 1.2e-8
KMEANS_S_PER_POINT_CLUSTER = 1.0e-5
LAKE_IMAGES = 20 * 40  # Lake's 20 one-shot runs: 20 test + 20 training images each


@dataclass(frozen=True)
class Cell:
    """One loss with one miner: what a study tunes and the finals retrain."""

    id: str
    loss: str
    miner: str | None
    loss_params: dict[str, Any]
    miner_params: dict[str, Any]
    search_space: dict[str, dict[str, Any]]  # "loss.<name>" / "miner.<name>" -> distribution
    dataset_level: bool = False

    @property
    def miner_label(self) -> str:
        return self.id.split("+", 1)[1]


@dataclass(frozen=True)
class Dropped:
    """A grid cell left out of the plan, and why (an incompatible pair, or not selected)."""

    cell: str
    reason: str


@dataclass(frozen=True)
class Budget:
    """What every cell receives: trials x folds training runs in tuning, then one run per final seed."""

    trials: int
    folds: int
    iterations: int  # per training run
    batch_size: int
    seeds: int

    @property
    def tuning_runs(self) -> int:
        return self.trials * self.folds

    @property
    def tuning_iterations(self) -> int:
        return self.tuning_runs * self.iterations

    @property
    def final_iterations(self) -> int:
        return self.seeds * self.iterations

    @property
    def total_iterations(self) -> int:
        return self.tuning_iterations + self.final_iterations

    @property
    def samples_seen(self) -> int:
        """An upper bound: dataset-level miners may serve smaller batches than P x K."""
        return self.total_iterations * self.batch_size


@dataclass(frozen=True)
class Estimate:
    """A wall-clock range in seconds; ``measured`` is False when a trunk's cost was scaled, not timed."""

    low_s: float
    high_s: float
    measured: bool

    @property
    def mid_s(self) -> float:
        return (self.low_s + self.high_s) / 2


@dataclass(frozen=True)
class Plan:
    """What a protocol will run: the cells, those dropped, the budget each cell gets and the time it
    should take (``estimates`` per cell id)."""

    protocol: Protocol
    cells: tuple[Cell, ...]
    dropped: tuple[Dropped, ...]
    budget: Budget
    estimates: dict[str, Estimate] = field(default_factory=dict)  # per cell id
    cost: TrunkCost | None = None  # the trunk cost the estimates used
    check_multiple: float = 0  # a budget check at this multiple is in the estimates (0: none)
    method_s: dict[str, float] = field(default_factory=dict)  # timed loss + miner seconds a step, per cell id

    @property
    def total_iterations(self) -> int:
        return self.budget.total_iterations * len(self.cells)

    @property
    def estimate(self) -> Estimate:
        values = list(self.estimates.values())
        return Estimate(sum(e.low_s for e in values), sum(e.high_s for e in values),
                        all(e.measured for e in values))

    def cell(self, cell_id: str) -> Cell:
        """The planned cell of this id; KeyError for a dropped or unknown one."""
        for c in self.cells:
            if c.id == cell_id:
                return c
        raise KeyError(cell_id)


def plan(protocol: Protocol, step_s: float | None = None, check_multiple: float = 0,
         time_methods: bool = False) -> Plan:
    """Cells (loss x miner) in grid order, dropped pairs with their reasons, one budget for all.

    ``step_s`` is a training step time measured on one's own device (it replaces the cost table);
    ``check_multiple`` adds a budget check at that multiple to the time estimate; ``time_methods``
    times each cell's loss and miner (`bench.method_cost`) and adds them to its steps."""
    doc = protocol.doc
    grid = doc["grid"]
    cells: list[Cell] = []
    dropped: list[Dropped] = []
    for loss_item in grid["losses"]:
        loss_entry = registry.get("loss", loss_item["name"])
        allowed = loss_item.get("miners")
        for miner_item in grid["miners"]:
            cell_id = f"{loss_item['label']}+{miner_item['label']}"
            miner_entry = None if miner_item["name"] == NO_MINER else registry.get("miner", miner_item["name"])
            reason = incompatibility(loss_entry, miner_entry)
            if reason:
                dropped.append(Dropped(cell_id, reason))
                continue
            if allowed is not None and miner_item["label"] not in allowed:
                dropped.append(Dropped(cell_id, NOT_SELECTED))
                continue
            cells.append(_cell(cell_id, loss_entry, loss_item, miner_entry, miner_item, doc["model"]))
    if not cells:  # a sweep of nothing would end "0 cells done", exit 0, with empty tables
        first = dropped[0]
        raise BenchError(f"{protocol.name}: the grid has no cell: every loss x miner pair was dropped "
                         f"({len(dropped)}; first {first.cell}: {first.reason})")
    training, validation = doc["training"], doc["data"]["validation"]
    budget = Budget(trials=doc["tuning"]["trials"], folds=validation["use"], iterations=training["iterations"],
                    batch_size=training["P"] * training["K"], seeds=len(doc["final"]["seeds"]))
    cost = trunk_cost(protocol, step_s)
    method_s: dict[str, float] = {}
    if time_methods:
        from bench.method_cost import time_cells

        method_s = time_cells(protocol, tuple(cells))
    estimates = {c.id: estimate_cell(protocol, c, budget, cost, check_multiple, method_s.get(c.id, 0.0))
                 for c in cells}
    return Plan(protocol, tuple(cells), tuple(dropped), budget, estimates, cost, check_multiple, method_s)


def incompatibility(loss: registry.Entry, miner: registry.Entry | None) -> str | None:
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
    "proxy": "{loss} is a proxy loss: it learns class proxies from labels, so {miner}'s {produces} would be ignored",
    "npair": "{loss} takes one positive pair per class (N-pair batches); {miner} produces {produces}",
    "quadruplets": "{loss} needs quadruplets; {miner} produces {produces} (use a quadruplet-capable miner)",
}


def _cell(cell_id: str, loss_entry: registry.Entry, loss_item: dict[str, Any],
          miner_entry: registry.Entry | None, miner_item: dict[str, Any], model: dict[str, Any]) -> Cell:
    """One cell: fixed parameters, and the searched ones less those the miner's tuples supply (dead there)."""
    supplied = miner_entry.supplies if miner_entry is not None else ()
    space = {f"loss.{k}": v for k, v in loss_item["search_space"].items() if k not in supplied}
    miner_params: dict[str, Any] = {}
    dataset_level = False
    if miner_entry is not None:
        space.update({f"miner.{k}": v for k, v in miner_item["search_space"].items()})
        miner_params = method_params(miner_entry, miner_item["params"], model)
        dataset_level = miner_entry.dataset_level(miner_params)
    return Cell(cell_id, loss_entry.name, miner_entry.name if miner_entry else None,
                method_params(loss_entry, loss_item["params"], model), miner_params, space, dataset_level)


# --------------------------------------------------------------------------- time


def dataset_size(spec: Any, classes: Any) -> tuple[float, float]:
    """(classes, images) of a dataset side, (0, 0) for a dataset of unknown size.

    A query/gallery test side counts the gallery's images (what each query is searched in) and
    the query's classes."""
    if isinstance(spec, dict):
        n_classes, _ = dataset_size(spec["query"], classes)
        _, gallery = dataset_size(spec["gallery"], None)
        return n_classes, gallery
    if spec not in DATASET_SIZES:
        return 0, 0
    n_classes, per_class = DATASET_SIZES[spec]
    if isinstance(classes, int):
        n_classes = classes
    elif isinstance(classes, list):
        n_classes = len(classes)
    return n_classes, n_classes * per_class


def _sized_test(test: Any) -> str:
    """The spec whose size stands for the test side's cost: a query/gallery side's gallery (every query ranks it)."""
    return test["gallery"] if isinstance(test, dict) else test


def _metrics_s(images: float, classes: float, clustering: bool) -> float:
    return RETRIEVAL_S_PER_PAIR * images**2 + (KMEANS_S_PER_POINT_CLUSTER * images * classes if clustering else 0)


def trunk_cost(protocol: Protocol, step_s: float | None = None) -> TrunkCost:
    """The cost table entry of the protocol's trunk on its device, or one made of a measured step time."""
    doc = protocol.doc
    trunk, gpu = doc["model"]["trunk"], str(doc["training"]["device"]).startswith("cuda")
    table = (GPU_TRUNK_COSTS, UNKNOWN_GPU_TRUNK) if gpu else (TRUNK_COSTS, UNKNOWN_TRUNK)
    cost = table[0].get(trunk, table[1])
    if step_s is None:
        return cost
    h, w = image_hw(doc["data"]["image_size"])
    batch = doc["training"]["P"] * doc["training"]["K"]
    embed_s = cost.embed_s * (h * w) / cost.ref_pixels
    return TrunkCost((step_s, step_s), embed_s, ref_batch=batch, ref_pixels=h * w, ref_hw=(h, w), source="--step-ms")


def estimate_cell(protocol: Protocol, cell: Cell, budget: Budget, cost: TrunkCost | None = None,
                  check_multiple: float = 0, method_s: float = 0.0) -> Estimate:
    """Seconds for one cell: training steps, evaluations (validation, pruning checks, test) and records.

    ``check_multiple`` > 0 adds a budget check: the finals retrained at that multiple of the budget
    with the same seeds, and evaluated again. ``method_s``: the cell's loss and miner, timed, a step."""
    doc = protocol.doc
    cost = cost or trunk_cost(protocol)
    h, w = image_hw(doc["data"]["image_size"])
    pixels = h * w  # an MLP's first layer and a conv trunk both scale with the pixel count
    scale = (budget.batch_size / cost.ref_batch) * (pixels / cost.ref_pixels)
    embed_one = cost.embed_s * pixels / cost.ref_pixels
    _, train_images = dataset_size(doc["data"]["train"], doc["data"]["train_classes"])
    test_classes, test_images = dataset_size(_sized_test(doc["data"]["test"]), doc["data"]["test_classes"])
    folds = doc["data"]["validation"]["folds"]
    val_images = train_images / folds
    per_step_extra = _miner_step_extra(cell, train_images * (folds - 1) / folds, embed_one) + method_s
    pruner = doc["tuning"]["pruner"]
    checks = 0 if pruner["type"] == "none" else budget.iterations // pruner["check_every"]
    one_val = val_images * embed_one + _metrics_s(val_images, 0, clustering=False)
    tuning_eval = budget.tuning_runs * (1 + checks) * one_val
    metrics = doc["evaluation"]["metrics"]
    lake = LAKE_IMAGES if "lake_accuracy" in metrics else 0
    clustering = "nmi" in metrics or "ami" in metrics
    final_eval = budget.seeds * ((test_images + lake) * embed_one + _metrics_s(test_images, test_classes, clustering))
    fixed = tuning_eval + final_eval + (budget.tuning_runs + budget.seeds + budget.trials + 1) * OVERHEAD_S_PER_RUN
    steps = budget.total_iterations + check_multiple * budget.final_iterations
    if check_multiple:
        fixed += final_eval + budget.seeds * OVERHEAD_S_PER_RUN
    low = steps * (cost.step_s[0] * scale + STEP_FIXED_S + per_step_extra) + fixed
    high = steps * (cost.step_s[1] * scale + STEP_FIXED_S + per_step_extra) + fixed
    return Estimate(low, high, cost.measured)


def _miner_step_extra(cell: Cell, train_images: float, embed_one: float) -> float:
    """Dataset-level miners embed training samples without gradient (`Entry.embeds_per_step`)."""
    if cell.miner is None or not cell.dataset_level:
        return 0.0
    entry = registry.get("miner", cell.miner)
    if entry.embeds_per_step is None:
        return 0.0
    return entry.embeds_per_step(entry.settings(cell.miner_params), train_images) * embed_one


# --------------------------------------------------------------------------- text


def lacks_amx(cpuinfo: str) -> bool:
    """Whether an x86 CPU's /proc/cpuinfo text shows no AMX bf16 units (False where it lists no flags).

    The CPU step costs in `TRUNK_COSTS` are fp32's. bf16 + channels-last made a Conv-4 step 2.1-2.5x
    faster on a CPU with AMX, but 1.18x on a Xeon with avx512_bf16 and no AMX, where fp32 + channels-last
    gave 1.35x (`benchmarks/bench_precision.py`, batch 128, one thread: 159 / 131 / 115 ms). A bf16 sweep
    there takes about twice what it takes with AMX, which decides whether it fits a session."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return "amx_bf16" not in line.split(":", 1)[-1].split()
    return False


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def format_plan(p: Plan, cpuinfo: str | None = None) -> str:
    """The plan as `dmlbench plan` prints it: data, model, budget, cells, dropped pairs, time.

    ``cpuinfo`` (default: this machine's /proc/cpuinfo) decides the note on bf16 without AMX."""
    from bench.data.query_gallery import describe

    doc, b = p.protocol.doc, p.budget
    data, model, training, val = doc["data"], doc["model"], doc["training"], doc["data"]["validation"]

    def classes(spec: str, given: Any) -> str:
        if isinstance(given, list):
            return f"{len(given)} classes"
        if isinstance(given, int):
            return f"{given} classes (seeded sample)"
        known = DATASET_SIZES.get(spec)
        return f"all {known[0]} classes" if known else "all classes"

    split = data.get("split")
    sides = (f"train {data['train']} ({classes(data['train'], data['train_classes'])}), "
             f"test {describe(data['test'])} ({classes(_sized_test(data['test']), data['test_classes'])}), "
             if split is None else
             f"pool {data['train']} split {split['test_classes']} of the classes for test (seed {split['seed']}), ")
    lines = [
        f"protocol {p.protocol.name} (hash {p.protocol.hash12}) from {p.protocol.source}",
        f"data: {sides}"
        f"{'x'.join(map(str, image_hw(data['image_size'])))}, augmentation {data['augmentation'] or 'none'}"
        f"{_augment_text(data.get('augment'))}",
        f"validation: {val['folds']} class-disjoint folds of the training classes"
        f"{' by ' + val['group_by'] if val['group_by'] else ''}, {val['use']} used per trial",
        f"model: {model['trunk']}, {model['embedding_dim']}-d embedding, "
        f"{'L2-normalised' if model['normalize'] else 'not normalised'}, distance {model['distance'] or 'per method'}",
        f"training: {training['optimizer']} lr {training['lr']:g}, batch P x K = {training['P']} x {training['K']} = "
        f"{b.batch_size}, {b.iterations} iterations a run",
        f"tuning: {b.trials} Optuna trials per cell (seeded TPE), pruner {doc['tuning']['pruner']['type']}; "
        f"final: seeds {', '.join(map(str, doc['final']['seeds']))}; primary metric {doc['evaluation']['primary']}",
        "",
        f"cells ({len(p.cells)}):",
    ]
    width = max([len(c.id) for c in p.cells] + [4])
    timed = bool(p.method_s)
    lines.append(f"  {'cell':<{width}}  trials  folds  iters/run  seeds  iterations  samples(max)  est. time"
                 + ("  loss+miner ms" if timed else ""))
    for c in p.cells:
        e = p.estimates[c.id]
        method = p.method_s.get(c.id)
        lines.append(f"  {c.id:<{width}}  {b.trials:>6}  {b.folds:>5}  {b.iterations:>9}  {b.seeds:>5}  "
                     f"{b.total_iterations:>10,}  {b.samples_seen:>12,}  {hms(e.mid_s)}"
                     + (f"  {'-' if method is None else f'{method * 1000:.3g}':>13}" if timed else ""))
    if p.dropped:
        lines += ["", f"dropped ({len(p.dropped)}):"]
        lines += [f"  {d.cell}: {d.reason}" for d in p.dropped if d.reason != NOT_SELECTED]
        unselected: dict[str, list[str]] = {}
        for d in p.dropped:
            if d.reason == NOT_SELECTED:
                loss, miner = d.cell.split("+", 1)
                unselected.setdefault(loss, []).append(miner)
        lines += [f"  {loss}+{{{', '.join(miners)}}}: {NOT_SELECTED}" for loss, miners in unselected.items()]
    e = p.estimate
    trunk = doc["model"]["trunk"]
    cost = p.cost or trunk_cost(p.protocol)
    note = cost.source or ("" if cost.measured else "not measured: scaled from conv4")
    step = f"{cost.step_s[0] * 1000:.3g}" + ("" if cost.step_s[0] == cost.step_s[1] else f"-{cost.step_s[1] * 1000:.3g}")
    h, w = cost.ref_hw or (math.isqrt(cost.ref_pixels),) * 2
    basis = (f"{trunk} step {step} ms at {h}x{w}, "
             f"batch {cost.ref_batch}" + (f", {note}" if note else ""))
    gpu = str(training["device"]).startswith("cuda")
    span = e.high_s > e.low_s * 1.001
    where = (f"estimated GPU time{{check}}: {e.mid_s / 3600:,.1f} GPU-hours on one GPU ("
             + (f"{e.low_s / 3600:,.1f} to {e.high_s / 3600:,.1f}; " if span else "") if gpu else
             f"estimated time on this machine{{check}}: {hms(e.mid_s)} ("
             + (f"{hms(e.low_s)} to {hms(e.high_s)}; " if span else ""))
    check = (f", with a budget check at {p.check_multiple:g}x the finals ({b.seeds} seeds x "
             f"{round(p.check_multiple * b.iterations):,} iterations a cell)" if p.check_multiple else "")
    lines += [
        "",
        f"budget, the same for every cell: {b.trials} trials x {b.folds} fold(s) x {b.iterations:,} iterations "
        f"+ {b.seeds} seeds x {b.iterations:,} iterations = {b.total_iterations:,} iterations "
        f"(at most {b.samples_seen:,} samples)",
        f"total: {len(p.cells)} cells, {len(p.cells) * b.trials} trials, {len(p.cells) * b.tuning_runs} tuning runs, "
        f"{len(p.cells) * b.seeds} final runs, {p.total_iterations:,} iterations",
        where.format(check=check) + f"{basis})",
    ]
    if timed:
        lines.append(f"loss+miner: timed here on one thread, random {b.batch_size}-sample batches (early training, "
                     f"an upper bound where mining shrinks), added to every step of the cell")
        ph, pw = image_hw(data["image_size"])  # the trunk's step at the protocol's batch and image size
        step_s = cost.step_s[0] * (b.batch_size / cost.ref_batch) * (ph * pw / cost.ref_pixels)
        slow = [(c, s) for c, s in p.method_s.items() if s > step_s]
        lines += [f"note: {c}'s loss and miner take {s * 1000:.3g} ms a step, {s / step_s:.1f}x the trunk's "
                  f"{step_s * 1000:.3g} ms: this cell costs more than the others" for c, s in slow]
    if not gpu and training["precision"] == "bf16" and cost.source != "--step-ms":
        amx = "has no AMX" if lacks_amx(_cpuinfo() if cpuinfo is None else cpuinfo) else "has AMX or is not x86"
        lines.append(f"note: the step time above is fp32's; bf16 + channels-last measured 2.1-2.5x faster on a "
                     f"CPU with AMX, 1.2x on one without (this CPU {amx}): time a step with "
                     f"benchmarks/bench_precision.py and pass --step-ms")
    return "\n".join(lines)


def _augment_text(augment: dict[str, Any] | None) -> str:
    """``data.augment``'s pipelines, one name list per side (their arguments are in the protocol)."""
    if not augment:
        return ""
    return "".join(f", {side} pipeline {' > '.join(next(iter(item)) for item in items)}"
                   for side, items in augment.items())
