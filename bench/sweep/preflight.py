"""The one pre-flight: every problem of a protocol and its stores that can be known before training.

`validate`, `plan`, `run` (`bench.sweep.runner.Sweep`) and `budget-check`
all ask `inspect` (or `problems`, or `refuse`), so a protocol `validate`
passes is one `run` accepts, and each refusal has one wording. In order:

* the plan (``grid``): a dead search parameter (`bench.sweep.probe.check_live`);
* every cell's loss and miner (``grid.<cell>``, one problem per cell): one step of
  mining, loss and backward on a random batch of the protocol's shape, on the
  CPU (`bench.plan.method_cost.check_cell`), so a method that raises is found
  before a trial is spent on it; a dataset-level miner is built, not called
  (its batches need the data), and its loss runs without it;
* ``training.device`` and ``training.precision`` on this machine (`bench.devices`);
* the stores, when asked: an empty ``--storage``/``--tracking-uri``, an
  unreachable server, an unwritable ``--results-dir``, the two stores in one
  database or swapped, and an emptied storage beside finished results
  (`bench.stores.checks`);
* the data (``data``): the paths, then loading and splitting as a sweep does
  (class and sample counts, P x K on every fold); the trunk built for the
  data's inputs and run on two of them (``model.trunk``); every image file
  decoded once (a file cut short, values outside their mode's range),
  remembered per file in the cache so that a later check decodes only what
  changed (`check_decodes`); the pretrained weights file
  (``model.pretrained``) is there, then fits the trunk; ``evaluation.ks``
  below the test set's size; training classes with fewer than K images
  (``training.short_classes``: refused under ``refuse``, counted in
  `Preflight.sampler` under ``repeat``, the default, which draws them with
  replacement).

A check that needs what an earlier one found wrong (the ks without the data)
is skipped. A device or precision this machine lacks is a ``note``: the file
is valid (a protocol for a GPU is written on a laptop), so `validate` prints
it and exits 0, while `run` and `budget-check` refuse it. Nothing here writes:
the default stores are named, not created.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.cell import protocol_trunk
from bench.devices import precision_problem
from bench.errors import BenchError
from bench.plan import Plan
from bench.plan import plan as make_plan
from bench.protocol import Protocol, device_problem
from bench.stores import checks, tracking
from bench.stores.urls import default_url, redact


@dataclass(frozen=True)
class Problem:
    """One problem: the key path it is about (``evaluation.ks``, ``--storage``, ``data``) and the one line
    every command prints for it. ``note``: a lack of this machine, not of the file (see the module)."""

    key: str
    message: str
    note: bool = False

    def __str__(self) -> str:
        return self.message


@dataclass
class Preflight:
    """What the pre-flight found, and what it built on the way (the plan, the loaded data) for the caller."""

    problems: list[Problem] = field(default_factory=list)
    plan: Plan | None = None
    prepared: Any = None  # bench.sweep.tuning.Prepared when the data were loaded
    sampler: dict[str, Any] | None = None  # K, the policy and the training classes below K (`short_classes`)

    @property
    def errors(self) -> list[Problem]:
        """The problems every command refuses (the notes aside)."""
        return [p for p in self.problems if not p.note]


def inspect(
    protocol: Protocol,
    *,
    data_root: str | None = None,
    data: bool = True,
    stores: bool = False,
    storage: str | None = None,
    tracking_uri: str | None = None,
    results_dir: str | Path | None = None,
    first: bool = False,
    decode: bool = True,
) -> Preflight:
    """Run the checks (module docstring) and return every problem found.

    ``data=False``: no data loaded and no weights file asked for (`plan`, ``validate --no-data``: the file
    alone). ``stores=True``: check the stores as `run` would open them (``None`` options are run's
    defaults). ``first=True``: stop at the first problem, note or not (what a refusing command wants). ``decode=False``:
    image files are not all decoded (`check_decodes`), only their headers read."""
    found = Preflight()

    def check(key: str, what: Callable[[], Any], note: bool = False) -> bool:
        """Run one check; False (after recording it) when it found a problem."""
        try:
            message = what()
        except BenchError as e:
            message = str(e)
        if message:
            found.problems.append(Problem(key, str(message), note))
            return False
        return True

    def stop() -> bool:
        return first and bool(found.problems)

    def plan_made() -> None:
        found.plan = make_plan(protocol)

    def plan_live() -> None:
        from bench.sweep.probe import check_live

        assert found.plan is not None
        check_live(found.plan)  # a dead search parameter would waste the budget: refuse before any record

    # the methods first: the liveness probe runs them too, and would stop at a broken one with a traceback
    if check("grid", plan_made) and _check_methods(protocol, found.plan, check, stop) and not stop():
        check("grid", plan_live)
    if found.plan is not None and found.plan.budget.final_mode == "folds" and not stop():
        check("final.mode", lambda: _folds_refused(protocol, found.plan))
    training = protocol.spec.training
    if stop() or not check(
        "training.device",
        lambda: _prefixed(protocol, "training.device", device_problem(training.device, availability=False)),
    ):
        return found
    check("training.device", lambda: _prefixed(protocol, "training.device", device_problem(training.device)), note=True)
    if not stop():
        check(
            "training.precision",
            lambda: _prefixed(protocol, "training.precision", precision_problem(training.precision, training.device)),
            note=True,
        )
    if stores and not stop():
        _check_stores(protocol, found, check, stop, storage, tracking_uri, results_dir)
    if data and not stop():
        _check_data(protocol, found, check, stop, data_root, decode)
    return found


def _check_methods(protocol: Protocol, plan: Plan | None, check: Callable[..., bool], stop: Callable[[], bool]) -> bool:
    """One step of every cell's loss and miner (`bench.plan.method_cost.check_cell`); False when one raised."""
    from bench.plan.method_cost import check_cell

    assert plan is not None
    ok = True
    for cell in plan.cells:
        ok &= check(
            f"grid.{cell.id}", lambda cell=cell: _prefixed(protocol, f"grid.{cell.id}", check_cell(protocol, cell))
        )
        if stop():
            break
    return ok


def _folds_refused(protocol: Protocol, plan: Plan | None) -> str | None:
    """``final.mode: folds`` scores the fold models' concatenated embeddings, which a learned metric (a ``g``
    for one model's embedding pairs) cannot rank."""
    from bench.sweep.floor import learned_metric_cells

    assert plan is not None
    learned = learned_metric_cells(protocol, plan.cells)
    if not learned:
        return None
    return (
        f"{protocol.name}: final.mode: folds concatenates the fold models' embeddings, which the learned metric "
        f"of {learned[0].id} cannot rank: use final.mode retrain, or leave the cell out"
    )


def problems(protocol: Protocol, **options: Any) -> list[Problem]:
    """Every problem `inspect` finds (the same keyword options)."""
    return inspect(protocol, **options).problems


def refuse(protocol: Protocol, **options: Any) -> Preflight:
    """`inspect` up to the first problem, raised as a BenchError (its one line); else what it built."""
    found = inspect(protocol, first=True, **options)
    if found.problems:
        raise BenchError(found.problems[0].message)
    return found


def _prefixed(protocol: Protocol, key: str, problem: str | None) -> str | None:
    return problem and f"{protocol.name}: {key}: {problem}"


# --------------------------------------------------------------------------- the stores


def check_writable(folder: Path) -> None:
    """The results folder can be made where it is asked for; created only once there is something to write,
    so a run refused for bad data or a bad store leaves nothing behind."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise BenchError(f"--results-dir {folder}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise BenchError(f"--results-dir {folder}: {existing} is not writable")


def _check_stores(
    protocol: Protocol,
    found: Preflight,
    check: Callable[..., bool],
    stop: Callable[[], bool],
    storage: str | None,
    tracking_uri: str | None,
    results_dir: str | Path | None,
) -> None:
    from bench.sweep import tables

    results_dir = "results" if results_dir is None else results_dir
    if not check("--storage", lambda: checks.check_given(storage, None)) or not check(
        "--tracking-uri", lambda: checks.check_given(None, tracking_uri)
    ):
        return
    if not check("--results-dir", lambda: check_writable(Path(results_dir))) and stop():
        return
    if tracking_uri and "://" in tracking_uri:  # an unreachable server fails now, not after the data are loaded
        if not check("--tracking-uri", lambda: tracking.check_reachable(tracking.with_connect_timeout(tracking_uri))):
            return
    storage_url = storage or default_url("optuna.db", create=False)
    urls: list[str] = []
    if not check("--tracking-uri", lambda: urls.append(tracking.resolve_tracking_uri(tracking_uri, create=False))):
        return
    if not check("--storage", lambda: checks.check_separate(storage_url, urls[0])) or stop():
        return
    if found.plan is None:
        return
    results = tables.protocol_dir(results_dir, protocol.name)
    check(
        "--storage",
        lambda: checks.check_not_emptied(
            tables.read_manifest(results),
            protocol.hash,
            protocol.shared_hash,
            results,
            storage_url,
            redact(storage_url),
            protocol.name,
        ),
    )


# --------------------------------------------------------------------------- the data and the weights


def check_weights(protocol: Protocol, in_shape: tuple[int, ...] | None = None) -> None:
    """The pretrained weights file is there and fits the trunk (bench.models.weights): inside a trial a bad
    file is a failed trial, every trial fails alike, and the failed trials would spend the tuning budget, so
    that fixing the file would not be enough to rerun. Without ``in_shape`` (the data not read yet) only the
    file's presence is checked; with it the trunk is built and the weights loaded, then dropped."""
    import torch

    from bench.models.weights import resolve

    pretrained = protocol.spec.model.pretrained
    if pretrained is None:
        return
    if in_shape is None:
        resolve(pretrained, protocol.spec.model.trunk)
        return
    with torch.random.fork_rng(devices=[]):  # the build draws the head's init: leave the sweep's RNG as it was
        protocol_trunk(protocol.spec.model, in_shape)


def check_ks(protocol: Protocol, test_samples: int) -> None:
    """Recall@k looks at the k nearest of the other test samples: at k >= N - 1 it is 1 for every
    method, a column that ranks nothing (found only once the test split's size is known)."""
    ev = protocol.spec.evaluation
    if "recall_at_k" not in ev.metrics:
        return
    absurd = [k for k in ev.ks if k >= test_samples - 1]
    if absurd:
        raise BenchError(
            f"{protocol.name}: evaluation.ks: k={absurd[0]} is not below the {test_samples - 1} "
            f"other test samples a query has: recall@{absurd[0]} would be 1 for every method"
        )


def trunk_problem(protocol: Protocol, in_shape: tuple[int, ...]) -> str | None:
    """The trunk built for the training inputs (no weights: `check_weights` loads those) and run on two zero
    inputs, in eval mode: inputs it cannot take (flat vectors for a convolutional trunk, images too small
    for its strides) fail now, not in the first trial after its records are opened. The build's random
    draws are forked off, so the sweep's RNG is as it was."""
    import torch

    from bench.trunks import trunk_from

    m = protocol.spec.model
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            trunk = trunk_from(m.trunk, in_shape, m.embedding_dim, dict(m.trunk_params)).eval()
            trunk(torch.zeros((2, *in_shape)))
    except BenchError as err:
        return str(err)
    except Exception as err:  # noqa: BLE001 - whatever the trunk raises on these inputs, in one line
        first = (str(err).strip().splitlines() or [""])[0][:200]
        return f"trunk {m.trunk!r} cannot take the data's inputs of shape {in_shape}: {type(err).__name__}: {first}"
    return None


def check_decodes(prepared: Any) -> None:
    """Every image file the sweep reads (training and test sides) decoded once (`bench.data.decode_check`):
    a file cut short or holding values outside its mode's range is named now, not mid-run."""
    from bench.data.decode_check import check_files
    from bench.data.images import ImageFiles
    from bench.data.query_gallery import QueryGallery

    test = prepared.test
    sides = [prepared.train, *((test.query, test.gallery) if isinstance(test, QueryGallery) else (test,))]
    check_files(side.x for side in sides if isinstance(side.x, ImageFiles))


def _check_data(
    protocol: Protocol,
    found: Preflight,
    check: Callable[..., bool],
    stop: Callable[[], bool],
    data_root: str | None,
    decode: bool = True,
) -> None:
    from bench.data import check_path
    from bench.data.query_gallery import test_specs
    from bench.sweep.prepare import prepare

    d = protocol.spec.data
    weights = check("model.pretrained", lambda: check_weights(protocol))  # would fail every trial: say where it goes
    if stop():
        return

    def load() -> None:
        for spec in (d.train, *test_specs(d.test)):
            check_path(spec)  # a missing path is one line, before any loading
        found.prepared = prepare(protocol, data_root)

    if not check("data", load) or stop():
        return
    prepared = found.prepared
    in_shape = tuple(prepared.train.x.shape[1:])
    if not check("model.trunk", lambda: _prefixed(protocol, "model.trunk", trunk_problem(protocol, in_shape))):
        return
    if weights:
        check("model.pretrained", lambda: check_weights(protocol, in_shape))  # damaged
    if not stop() and decode:
        check("data", lambda: check_decodes(prepared))
    if not stop():
        check("evaluation.ks", lambda: check_ks(protocol, len(prepared.test)))  # query/gallery: its gallery's size
    if not stop():
        found.sampler = short_classes(protocol, prepared.train.y)
        check("training.short_classes", lambda: short_classes_problem(protocol, found.sampler))


def short_classes(protocol: Protocol, labels: Any) -> dict[str, Any]:
    """K, ``training.short_classes`` and how many of the training classes (of ``labels``) have fewer than K
    images, the smallest count among them: what the manifest records under ``sampler``."""
    import torch

    k = int(protocol.spec.training.K)
    _, counts = torch.unique(torch.as_tensor(labels), return_counts=True)
    short = counts[counts < k]
    return {
        "K": k,
        "policy": protocol.spec.training.short_classes,
        "classes": len(counts),
        "short_classes": len(short),
        "smallest": int(short.min()) if len(short) else int(counts.min()),
    }


def short_classes_problem(protocol: Protocol, sampler: dict[str, Any]) -> str | None:
    """Under ``training.short_classes: refuse``, the training classes with fewer than K images, in one line."""
    if sampler["policy"] != "refuse" or not sampler["short_classes"]:
        return None
    return (
        f"{protocol.name}: training.short_classes: {sampler['short_classes']} of {sampler['classes']} training "
        f"classes have fewer than K={sampler['K']} images (the smallest {sampler['smallest']}); lower "
        f"training.K, or set training.short_classes: repeat to draw them with replacement"
    )


def short_classes_notice(sampler: dict[str, Any]) -> str | None:
    """Under ``repeat``, the one line saying how many training classes will be drawn with replacement."""
    if not sampler["short_classes"]:
        return None
    return (
        f"{sampler['short_classes']} of {sampler['classes']} training classes have fewer than K={sampler['K']} "
        f"images (the smallest {sampler['smallest']}): drawn with replacement (training.short_classes: repeat)"
    )
