"""Reading a protocol file: safe YAML, schema, registry names, defaults, hash.

A protocol names registry entries and numbers, never code: the YAML is read
with a safe loader (no tags, no objects) that also refuses duplicate keys,
which a plain loader would silently resolve to the last one. Every problem
is reported as ``FILE:LINE: key.path: what was expected``.

The hash is sha256 of the canonical JSON of the validated document with
every default filled in (registry search spaces included), so reformatting,
reordering keys or writing a default out keeps the hash, while any change of
meaning, in the file or in a registry default it relies on, gives a new one.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bench.devices import AUTO, precision_problem
from bench.errors import BenchError
from bench.spec import Spec
from bench.spec.safe_yaml import YamlRefused, load_yaml, read_text
from bench.spec.schema import (
    DEFAULTS,
    METRICS,
    PRUNER_DEFAULTS,
    REID_METRICS,
    RETRIEVAL_METRICS,
    SCHEMA,
    describe_error,
    error_path,
    image_hw,
)

NO_MINER = "none"


class ProtocolError(BenchError):
    """Every problem of a protocol file, one line each; the message is the first one."""

    def __init__(self, problems: list[str]) -> None:
        more = f" (and {len(problems) - 1} more: see dmlbench validate)" if len(problems) > 1 else ""
        super().__init__(problems[0] + more)
        self.problems = problems


@dataclass(frozen=True)
class Protocol:
    """A validated protocol: the normalised document, its hash and where it came from.

    `doc` is the canonical form (defaults filled, registry search spaces
    merged), what the hash covers, read only inside this package; `spec`
    is the same as typed sections (`bench.spec.Spec`), what the rest of the
    package reads, so every consumer sees the values the hash covers, except
    that paths are absolute (`resolve_paths`) where the hash took them as
    written. `text` is the
    file as written, kept as the artifact of every record. `data` is the
    fingerprint of the data a sweep read (`bench.data.fingerprint`), set
    once the data are loaded. `shared_hash` covers what every cell shares
    (all but the grid): a sweep's records are keyed per cell by it, the
    cell's own definition and the data (`bench.plan.cell_key`), the floor
    by `shared_key`, so a sweep on changed data never reuses or mixes old
    records, and one with a cell added keeps the other cells'.
    """

    doc: dict[str, Any]
    hash: str
    source: str
    text: str
    data: str = ""
    shared_hash: str = ""  # sha256 of the shared settings: everything but the grid (`shared_hash`)
    spec: Spec = field(init=False, repr=False, compare=False)  # `doc` as typed sections: what code reads

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", Spec.from_doc(self.doc))

    def with_data(self, fingerprint: str) -> Protocol:
        """This protocol bound to the data it runs on (its records' key then names both)."""
        return replace(self, data=fingerprint)

    def with_precision(self, precision: str, channels_last: bool) -> Protocol:
        """This protocol with ``precision: auto`` resolved to what a sweep chose at its start (`bench.sweep.
        precision`): the same hash, text and records (auto is what the file says and the hash covers), the
        document's ``training.precision`` and ``channels_last`` the chosen ones, so every run trains in them."""
        doc = copy.deepcopy(self.doc)
        doc["training"]["precision"], doc["training"]["channels_last"] = precision, channels_last
        return replace(self, doc=doc)

    def with_seed(self, seed: int) -> Protocol:
        """This protocol with another top-level ``seed`` (a tuning draw's, `bench.sweep.tuning`): the same
        hash, text and records; every seed derived from ``seed`` changes."""
        doc = copy.deepcopy(self.doc)
        doc["seed"] = seed
        return replace(self, doc=doc)

    def with_device(self, device: str) -> Protocol:
        """This protocol trained on ``device`` (`dmlbench run --device`): the same hash, text and records (a
        sweep resumed on another device continues the same cells), the document's ``training.device`` the
        given one; the sweep's manifest names the override, since results agree across devices only within
        rounding."""
        doc = copy.deepcopy(self.doc)
        doc["training"]["device"] = device
        return replace(self, doc=doc)

    @property
    def precision_auto(self) -> bool:
        """Whether the file says ``precision: auto`` (and no sweep has resolved it in this object yet)."""
        return self.spec.training.precision == AUTO

    @property
    def key12(self) -> str:
        """The whole protocol's hash, and the data once bound (records are keyed per cell: `shared_key`)."""
        return f"{self.hash12}.{self.data[:8]}" if self.data else self.hash12

    @property
    def shared_key(self) -> str:
        """What records common to every cell (the floor) are keyed by: the shared settings' hash, and the
        data once bound. Two versions of a protocol with the same shared key differ only by their cells."""
        return f"{self.shared_hash[:12]}.{self.data[:8]}" if self.data else self.shared_hash[:12]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def hash12(self) -> str:
        return self.hash[:12]

    @property
    def seed(self) -> int:
        return self.spec.seed

    @property
    def final_seeds(self) -> list[int]:
        """Every final seed a cell may train, in order: the list, or a range's 0 .. max - 1 (`bench.plan.seeds`)."""
        return list(self.spec.final.seeds)

    @property
    def primary(self) -> str:
        return self.spec.evaluation.primary


# --------------------------------------------------------------------------- YAML


def _lines(node: yaml.Node | None, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Key path -> 1-based line of every node, so errors can point into the file."""
    out = {} if out is None else out
    if node is None:
        return out
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = (*path, key_node.value if isinstance(key_node, yaml.ScalarNode) else "?")
            out[key] = key_node.start_mark.line + 1
            _lines(value_node, key, out)
            out[key] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, (*path, i), out)
    return out


# --------------------------------------------------------------------------- loading


def load_protocol(path: str | Path) -> Protocol:
    """Read, validate and normalise a protocol file; a ProtocolError lists what is wrong.

    Relative paths in it (``folder:``/``npz:`` data specs, a ``model.pretrained`` path) are relative to
    the file's folder, wherever the command runs from (`parse_protocol`)."""
    path = Path(path)
    return parse_protocol(read_text(path, "protocol"), str(path)[:200], base=path.expanduser().resolve().parent)


def parse_protocol(text: str, source: str = "<protocol>", base: str | Path | None = None) -> Protocol:
    """A protocol from YAML text, schema-checked, defaults filled in, then registry names and cross-field
    rules checked; every problem is one line naming ``source``, the line and the key path, all of them
    in one ProtocolError.

    The hash covers the paths as written (a checkout elsewhere keeps it); `doc` then holds them absolute
    (`resolve_paths`), joined to `base`: the protocol file's folder, or, for text without a file
    (``base`` None), the current directory at the time of parsing."""
    try:
        raw, node = load_yaml(text, source)
    except YamlRefused as e:
        raise ProtocolError([str(e)]) from None
    lines = _lines(node)
    report = _Reporter(source, lines)
    if not isinstance(raw, dict):
        report.add(
            (),
            "expected a mapping of protocol sections, got " + ("an empty file" if raw is None else type(raw).__name__),
        )
        report.raise_if_any()
    _check_schema(raw, report)
    _check_finite(raw, (), report)
    report.raise_if_any()
    _check_data_sources(raw["data"], report)
    report.raise_if_any()
    doc = _with_defaults(raw)
    _check_semantics(doc, report)
    report.raise_if_any()
    return Protocol(
        doc=resolve_paths(doc, Path.cwd() if base is None else Path(base)),
        hash=protocol_hash(doc),
        source=source,
        text=text,
        shared_hash=shared_hash(doc),
    )


def resolve_paths(doc: dict[str, Any], base: Path) -> dict[str, Any]:
    """The document with every path-valued key made absolute against ``base``: ``folder:``/``npz:`` specs of
    ``data.train`` and ``data.test`` (``data.pool`` is both by now; query and gallery too), and
    ``model.pretrained`` when it is a path (a ``/`` in it or a leading ``~``; a bare file name is looked up in
    torch hub's cache, `bench.models.weights.resolve`). What the data loaders, the trainer and the manifest
    receive; the hash is taken before, on the paths as written."""
    from bench.data import resolve_spec

    out = copy.deepcopy(doc)
    data = out["data"]
    for key in ("train", "test"):
        value = data.get(key)
        if isinstance(value, str):
            data[key] = resolve_spec(value, base)
        elif isinstance(value, dict):
            data[key] = {
                side: resolve_spec(spec, base) if isinstance(spec, str) else spec for side, spec in value.items()
            }
    weights = out["model"].get("pretrained")
    if isinstance(weights, str) and ("/" in weights or "\\" in weights or weights.startswith("~")):
        path = Path(weights).expanduser()
        out["model"]["pretrained"] = os.path.normpath(path if path.is_absolute() else base / path)
    return out


def protocol_hash(doc: dict[str, Any]) -> str:
    """sha256 of the document, and of the plugin code it uses: new plugin code is a new protocol.

    A protocol naming only built-in and PML entries hashes its document
    alone, as before plugins existed, so its hash does not change.
    """
    plugins = plugin_fingerprints(doc)
    doc = _without_unhashed(doc)
    body = {"protocol": doc, "plugins": plugins} if plugins else doc
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


SHARED_EXCLUDED = ("grid", "description")
# keys that change no result, so neither hash covers them: how many workers decode the images, whether the
# final models are kept (bench.sweep.kept)
HASH_EXCLUDED = (("data", "loader"), ("final", "keep_models"))


def _without_unhashed(doc: dict[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    for section, key in HASH_EXCLUDED:
        if isinstance(out.get(section), dict) and key in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    return out


def shared_hash(doc: dict[str, Any]) -> str:
    """sha256 of what every cell of the protocol shares: the document without its grid (the cells, hashed
    one by one in `bench.plan.grid.cell_digest`) and without its description (words, not a setting), and
    the trunk's plugin code. The data loader's workers are left out as in `protocol_hash`.

    A change here is a new version of the whole sweep (every cell retrains); adding, removing or editing
    one cell leaves it, and so every other cell's records, as they were."""
    body = {k: v for k, v in _without_unhashed(doc).items() if k not in SHARED_EXCLUDED}
    trunk = plugin_fingerprints({"model": doc.get("model", {})})
    return hashlib.sha256(canonical_json({"shared": body, "plugins": trunk}).encode()).hexdigest()


def plugin_fingerprints(doc: dict[str, Any]) -> dict[str, dict[str, str]]:
    """``kind:name`` -> version and source sha256 of every plugin entry the document names."""
    from bench import registry

    used = [("trunk", doc.get("model", {}).get("trunk"))]
    used += [
        (kind, item.get("name"))
        for kind, section in (("loss", "losses"), ("miner", "miners"))
        for item in doc.get("grid", {}).get(section, [])
    ]
    out = {}
    for kind, name in used:
        if not isinstance(name, str) or name == NO_MINER:
            continue
        entry = registry.get(kind, name)
        if entry.plugin:
            # not where it was loaded from: a worker on another machine or folder must find the same hash
            out[f"{kind}:{name}"] = {"version": entry.version, "sha256": entry.source_hash}
    return out


def canonical_json(doc: Any) -> str:
    """Sorted keys, no spaces, integral floats as integers (``lr: 1`` and ``lr: 1.0`` mean the same)."""
    return json.dumps(_canonical(doc), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


class _Reporter:
    def __init__(self, source: str, lines: dict[tuple, int]) -> None:
        self.source, self.lines = source, lines
        self.problems: list[str] = []
        self.paths: set[tuple] = set()

    def add(self, path: tuple, message: str) -> None:
        self.paths.add(path)
        line = next((self.lines[path[:n]] for n in range(len(path), -1, -1) if path[:n] in self.lines), None)
        where = f"{self.source}:{line}" if line else self.source
        self.problems.append(f"{where}: {format_path(path) or '(top level)'}: {message}")

    def raise_if_any(self) -> None:
        if self.problems:
            raise ProtocolError(self.problems)


def format_path(path: tuple) -> str:
    """A key path as the user writes it: ``grid.losses[0].search_space``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _check_schema(raw: dict[str, Any], report: _Reporter) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(SCHEMA)
    errors = sorted(validator.iter_errors(raw), key=lambda e: [str(p) for p in error_path(e)])
    for error in errors:
        report.add(error_path(error), describe_error(error))


def _check_finite(value: Any, path: tuple, report: _Reporter) -> None:
    """No nan or inf anywhere: the schema's bounds cannot see them (``nan > 0`` and ``nan <= 0`` are both
    false), and a learning rate, decay, step or parameter of nan or inf trains nothing while exit 0."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, (*path, key), report)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_finite(item, (*path, i), report)
    elif isinstance(value, float) and not math.isfinite(value) and path not in report.paths:
        report.add(path, f"expected a finite number, got {value}")


def _with_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(raw)
    _normalise_data(doc["data"], raw.get("seed", DEFAULTS["seed"]))
    _drop_absent_defaults(doc)
    for dotted, value in DEFAULTS.items():
        *parents, key = dotted.split(".")
        target = doc
        for p in parents:
            target = target[p]
        if key not in target:
            target[key] = copy.deepcopy(value)
    pruner = doc["tuning"]["pruner"]
    if pruner["type"] != "none":
        for key, value in PRUNER_DEFAULTS.items():
            pruner.setdefault(key, value)
        if pruner["check_every"] is None:  # under early stopping the pruner is told the early-stopping scores
            stopping = doc["training"].get("early_stopping")
            pruner["check_every"] = stopping["check_every"] if stopping else max(1, doc["training"]["iterations"] // 4)
    validation = doc["data"]["validation"]
    if validation["use"] is None:
        validation["use"] = validation["folds"]
    seeds = doc["final"]["seeds"]
    if isinstance(seeds, dict):  # a range (bench.plan.seeds): kept as written, the seeds are 0 .. max - 1
        doc["final"]["seeds"] = {"min": seeds["min"], "max": seeds["max"], "half_width": seeds["half_width"]}
    else:
        doc["final"]["seeds"] = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    strategy = doc["tuning"].get("strategy")
    if strategy:
        strategy.setdefault("eta", 3)
        strategy.setdefault("max_iterations", doc["training"]["iterations"])
    for kind in ("losses", "miners"):
        for entry in doc["grid"][kind]:
            entry.setdefault("label", entry["name"].replace(":", "-"))
            entry.setdefault("params", {})
            entry.setdefault("search_space", {})
    if "metrics" in doc["evaluation"]:
        doc["evaluation"]["metrics"] = [m for m in METRICS if m in doc["evaluation"]["metrics"]]
    return doc


# --------------------------------------------------------------------------- meaning


def _check_training(training: dict[str, Any], report: _Reporter) -> None:
    """What the trainer would refuse at its first trial, refused at validation: a schedule that does not
    fit the budget, and fp16 on the CPU (no grad scaler there, and slow)."""
    from bench.training import schedule_problem

    problem = schedule_problem(training["schedule"], training["iterations"])
    if problem:
        report.add(("training", "schedule"), problem)
    problem = precision_problem(training["precision"], str(training["device"]), availability=False)
    if problem:
        report.add(("training", "precision"), problem)


def _check_semantics(doc: dict[str, Any], report: _Reporter) -> None:
    """What a schema cannot say: registry names and parameters, ranges, cross-references."""
    from bench import registry

    def entry_or_report(kind: str, name: str, path: tuple) -> Any:
        try:
            return registry.get(kind, name)
        except BenchError as e:
            report.add(path, str(e))
            return None

    model = doc["model"]
    trunk = entry_or_report("trunk", model["trunk"], ("model", "trunk"))
    if trunk is not None:
        if _check_param_names(
            trunk, model["trunk_params"], ("model", "trunk_params"), report, exclude=("in_shape", "embedding_dim")
        ):
            from bench.trunks import check_size

            h, w = image_hw(doc["data"]["image_size"])
            try:
                check_size(model["trunk"], (1, h, w), model["embedding_dim"], model["trunk_params"])
            except BenchError as e:
                small = "too small" in str(e)  # the image, not the trunk, is what the user sets wrong
                report.add(("data", "image_size") if small else ("model",), str(e))
                return  # methods are built with this embedding size below: an absurd one would allocate it
            _check_trunk_options(doc, report)

    labels: dict[str, tuple] = {}
    written: dict[int, list[str]] = {}  # loss index -> parameters its search_space names (before the merge)
    for kind, section in (("loss", "losses"), ("miner", "miners")):
        for i, item in enumerate(doc["grid"][section]):
            path = ("grid", section, i)
            if item["label"] in labels and labels[item["label"]][0] == section:
                report.add(
                    (*path, "label"),
                    f"label {item['label']!r} is used twice in grid.{section}: give one of them another label",
                )
            labels[item["label"]] = (section, i)
            if kind == "miner" and item["name"] == NO_MINER:
                if item["params"] or item["search_space"]:
                    report.add(path, "miner 'none' takes no params or search_space")
                continue
            if kind == "miner" and "miners" in item:
                report.add((*path, "miners"), "only a loss can restrict its miners")
            entry = entry_or_report(kind, item["name"], (*path, "name"))
            if entry is None:
                continue
            if kind == "loss":
                written[i] = [k for k, v in item["search_space"].items() if v is not None]
            merged = _merge_search_space(entry, item, path, report)
            if merged is None:  # a parameter name it lacks, said once: building it would only say it again
                continue
            item["search_space"] = merged
            _try_build(kind, entry, item, doc, path, report)
            _check_batch_needs(entry, doc["training"], path, report)
            if kind == "miner":
                _check_served_batch(entry, item, doc["training"], path, report)

    miner_labels = [m["label"] for m in doc["grid"]["miners"]]
    for i, item in enumerate(doc["grid"]["losses"]):
        for j, name in enumerate(item.get("miners", [])):
            if name not in miner_labels:
                report.add(
                    ("grid", "losses", i, "miners", j),
                    f"no miner labelled {name!r} in grid.miners: expected one of {', '.join(miner_labels)}",
                )
    _check_supplied(doc, written, report)
    _check_training(doc["training"], report)

    evaluation = doc["evaluation"]
    if evaluation["primary"] not in evaluation["metrics"]:
        report.add(
            ("evaluation", "primary"),
            f"the primary metric {evaluation['primary']!r} must be one of "
            f"evaluation.metrics ({', '.join(evaluation['metrics'])})",
        )
    assert set(RETRIEVAL_METRICS) <= set(METRICS)

    validation = doc["data"]["validation"]
    if validation["use"] > validation["folds"]:
        report.add(
            ("data", "validation", "use"), f"expected at most folds={validation['folds']}, got {validation['use']}"
        )
    _check_data_classes(doc["data"], report)
    _check_augment(doc["data"], report)
    _check_query_gallery(doc, report)
    _check_image_size(doc, trunk, report)
    pruner = doc["tuning"]["pruner"]
    if pruner["type"] != "none" and pruner["check_every"] > doc["training"]["iterations"]:
        report.add(
            ("tuning", "pruner", "check_every"),
            f"expected at most training.iterations={doc['training']['iterations']}, got {pruner['check_every']}",
        )
    _check_early_stopping(doc, report)
    _check_final_mode(doc, report)
    _check_strategy(doc, report)


def _check_strategy(doc: dict[str, Any], report: _Reporter) -> None:
    """``tuning.strategy`` decides which trials go on by itself (no pruner beside it), its rungs lie within the
    training budget, and under early stopping every rung has a check; ``final.seeds`` as a range runs from
    ``min`` to ``max``."""
    seeds = doc["final"]["seeds"]
    if isinstance(seeds, dict) and seeds["min"] > seeds["max"]:
        report.add(("final", "seeds", "min"), f"expected at most max={seeds['max']}, got {seeds['min']}")
    strategy = doc["tuning"].get("strategy")
    if not strategy:
        return
    if doc["tuning"].get("unsearched") == "one":
        # the rungs are one schedule for every cell; a cell with one trial would have another budget
        report.add(("tuning", "unsearched"), "successive_halving gives every cell the same rungs: leave it out")
    iterations = doc["training"]["iterations"]
    if doc["tuning"]["pruner"]["type"] != "none":
        report.add(("tuning", "pruner"), "successive_halving stops trials by its rungs: use pruner {type: none}")
    top = strategy["max_iterations"]
    if top > iterations:
        report.add(
            ("tuning", "strategy", "max_iterations"),
            f"expected at most training.iterations={iterations}, got {top}",
        )
    if strategy["min_iterations"] >= top:
        report.add(
            ("tuning", "strategy", "min_iterations"),
            f"expected less than the top rung's {top} iterations, got {strategy['min_iterations']}",
        )
    stopping = doc["training"].get("early_stopping")
    if stopping and stopping["check_every"] > strategy["min_iterations"]:
        report.add(
            ("tuning", "strategy", "min_iterations"),
            f"expected at least training.early_stopping.check_every={stopping['check_every']} (a rung's run is "
            f"scored at its best check), got {strategy['min_iterations']}",
        )


def _check_final_mode(doc: dict[str, Any], report: _Reporter) -> None:
    """``final.mode: folds`` trains one final model per validation fold the trials use, and concatenates them:
    it needs two folds at least (one fold model concatenated is that model)."""
    from bench.spec.schema import setting

    use = doc["data"]["validation"]["use"]
    if setting(doc, "final.mode") == "folds" and use < 2:
        report.add(
            ("final", "mode"),
            f"folds needs at least 2 validation folds in use (data.validation), got {use}: "
            "with one, 'concatenated' is the one fold model; use mode retrain",
        )


def _check_early_stopping(doc: dict[str, Any], report: _Reporter) -> None:
    """``training.early_stopping``: its cap is the budget (``max_iterations`` = ``training.iterations``, so the
    plan, the audit and the budget check count one number), it checks within it, and a pruner is told the
    early-stopping scores (its ``check_every`` the same), one validation score per check."""
    stopping = doc["training"].get("early_stopping")
    if not stopping:
        return
    iterations = doc["training"]["iterations"]
    if stopping["max_iterations"] != iterations:
        report.add(
            ("training", "early_stopping", "max_iterations"),
            f"expected training.iterations={iterations} (the budget: the most any run trains), "
            f"got {stopping['max_iterations']}",
        )
    if stopping["check_every"] > iterations:
        report.add(
            ("training", "early_stopping", "check_every"),
            f"expected at most training.iterations={iterations}, got {stopping['check_every']}",
        )
    pruner = doc["tuning"]["pruner"]
    if pruner["type"] != "none" and pruner["check_every"] != stopping["check_every"]:
        report.add(
            ("tuning", "pruner", "check_every"),
            f"expected training.early_stopping.check_every={stopping['check_every']} (the pruner is told the "
            f"early-stopping scores), got {pruner['check_every']}",
        )


# --------------------------------------------------------------------------- data and split


def _check_data_sources(data: dict[str, Any], report: _Reporter) -> None:
    """Either one `pool` split for the user, or `train` and `test` (before the pool is normalised away)."""
    if "pool" in data:
        for key in ("train", "test", "train_classes", "test_classes"):
            if key in data:
                report.add(("data", key), f"data.pool is split by data.split: remove data.{key}")
        if "split" not in data:
            report.add(("data", "split"), "data.pool needs data.split, e.g. {test_classes: 0.5, seed: 0}")
        return
    for key in ("train", "test"):
        if key not in data:
            report.add(("data", key), "missing: a required key")


def _normalise_data(data: dict[str, Any], seed: int) -> None:
    """One canonical form, so equal meanings hash equal: a pool is train = test = pool with a split;
    the split's seed defaults to the protocol seed; channel names become 1 or 3; defaults of the
    image options are dropped (their absence is the default, and old protocols keep their hash)."""
    from bench.spec.schema import CHANNELS

    if "pool" in data:
        data["train"] = data["test"] = data.pop("pool")
    if "split" in data:
        data["split"].setdefault("seed", seed)
        count = data["split"]["test_classes"]
        if isinstance(count, float) and count.is_integer():
            data["split"]["test_classes"] = int(count)
    size = data.get("image_size")
    if isinstance(size, list) and len(size) == 2 and size[0] == size[1]:
        data["image_size"] = size[0]  # [s, s] is s: one meaning, one hash
    if data.get("resize") == "stretch":
        del data["resize"]
    if "augment" in data:  # bare names as {Name: {}}; no pipeline is the default (decode, make square, resize)
        from bench.data.augment import normalise as normalise_augment

        try:
            data["augment"] = normalise_augment(data["augment"])
        except BenchError:
            pass  # reported with its place by _check_augment
        if not data["augment"]:
            del data["augment"]
    if "loader" in data:  # null is each option's default, so it is left out
        data["loader"] = {k: v for k, v in data["loader"].items() if v is not None}
        if not data["loader"]:
            del data["loader"]
    if "channels" in data:
        channels = data.pop("channels")
        if channels is not None:
            data["channels"] = CHANNELS[str(channels)]


def _check_trunk_options(doc: dict[str, Any], report: _Reporter) -> None:
    """model.pretrained, model.freeze_bn and training.trunk_lr against the trunk (bench.models.trunk)."""
    from bench.spec.schema import setting
    from bench.trunks import option_problems

    model, (h, w) = doc["model"], image_hw(doc["data"]["image_size"])
    problems = option_problems(
        model["trunk"],
        (1, h, w),
        model["embedding_dim"],
        model["trunk_params"],
        setting(doc, "model.pretrained"),
        setting(doc, "model.freeze_bn"),
        setting(doc, "training.trunk_lr"),
    )
    for dotted, message in problems.items():
        report.add(tuple(dotted.split(".")), message)


def _drop_absent_defaults(doc: dict[str, Any]) -> None:
    """Keys of ABSENT_DEFAULTS written at their default are removed (and trunk_lr equal to lr), so writing
    a default out keeps the hash of the protocol that leaves it out."""
    from bench.spec.schema import ABSENT_DEFAULTS

    for dotted, default in ABSENT_DEFAULTS.items():
        section, key = dotted.split(".")
        if key in doc[section] and doc[section][key] == default and type(doc[section][key]) is type(default):
            del doc[section][key]
    training = doc["training"]
    if training.get("trunk_lr") == training["lr"]:
        del training["trunk_lr"]


def _check_data_classes(data: dict[str, Any], report: _Reporter) -> None:
    """Test classes unseen in training, as far as the protocol alone can tell (the data says the rest)."""
    train_c, test_c = data["train_classes"], data["test_classes"]
    split = data.get("split")
    if split is not None:
        if data["train"] != data["test"]:
            report.add(("data", "split"), "data.split divides one dataset: give data.pool (or the same train and test)")
        for key in ("train_classes", "test_classes"):
            if data[key] is not None:
                report.add(("data", key), f"data.split chooses the classes: remove data.{key}")
        if split["test_classes"] > 1 and not isinstance(split["test_classes"], int):
            report.add(
                ("data", "split", "test_classes"),
                f"expected a count (an integer) or a fraction in (0, 1), got {split['test_classes']}",
            )
        return
    same = data["train"] == data["test"]  # across two datasets, class identities are compared on the data
    if same and isinstance(train_c, list) and isinstance(test_c, list) and set(train_c) & set(test_c):
        shared = sorted(set(train_c) & set(test_c), key=str)
        report.add(
            ("data", "test_classes"),
            f"test classes must be unseen in training; shared with train_classes: {', '.join(map(str, shared[:5]))}",
        )
    if same and not (isinstance(train_c, list) and isinstance(test_c, list)):
        report.add(
            ("data", "test"),
            "train and test name the same dataset: give disjoint class lists in "
            "train_classes and test_classes, or data.split",
        )


def _check_augment(data: dict[str, Any], report: _Reporter) -> None:
    """Every named transform built once (torchvision imported only when a protocol names one)."""
    if "augment" not in data:
        return
    from bench.data.augment import check

    try:
        check(data["augment"])
    except BenchError as e:
        report.add(("data", "augment"), str(e))


def _check_query_gallery(doc: dict[str, Any], report: _Reporter) -> None:
    """What a ``data.test`` of a query and a gallery allows (whether the data has cameras is checked on the
    data): both sets are used whole; the re-ID metrics need them; clustering and Lake's runs need one set."""
    from bench.data.query_gallery import is_query_gallery

    data, metrics = doc["data"], doc["evaluation"]["metrics"]
    if not is_query_gallery(data["test"]):
        for metric in (m for m in REID_METRICS if m in metrics):
            report.add(
                ("evaluation", "metrics"),
                f"{metric} ranks a query set against a gallery: give data.test "
                "as {query: SPEC, gallery: SPEC} (data with a per-sample camera)",
            )
        return
    if data["test_classes"] is not None:
        report.add(("data", "test_classes"), "data.test {query, gallery} is used whole: remove data.test_classes")
    for metric in (m for m in ("nmi", "ami", "lake_accuracy") if m in metrics):
        report.add(
            ("evaluation", "metrics"),
            f"{metric} needs one test set, not a query set and a gallery: "
            f"remove {metric} or give data.test as one spec",
        )


MIN_IMAGE_SIZE = 4  # below this an image has no shape to learn from; a 1x1 run still "ranked" its cells


def _check_image_size(doc: dict[str, Any], trunk: Any, report: _Reporter) -> None:
    """An image side every trunk can take: too small for the trunk is found now (built on the meta device,
    so nothing is allocated), not as a failure of every trial."""
    from bench import registry

    size = doc["data"]["image_size"]
    h, w = image_hw(size)
    if min(h, w) < MIN_IMAGE_SIZE:
        report.add(("data", "image_size"), f"expected at least {MIN_IMAGE_SIZE} pixels a side, got {size}")
        return
    augment = doc["data"].get("augment") or {}
    if h != w and not (augment.get("train") and augment.get("eval")):
        report.add(
            ("data", "image_size"),
            f"{h}x{w} is not square: only image files with both data.augment.train "
            "and data.augment.eval, ending at that size, take it",
        )
        return
    if trunk is None:
        return
    try:
        import torch

        with torch.device("meta"):
            registry.build_trunk(
                trunk.name,
                in_shape=(1, h, w),
                embedding_dim=doc["model"]["embedding_dim"],
                **doc["model"]["trunk_params"],
            )
    except BenchError as e:
        if "too small" in str(e):
            report.add(("data", "image_size"), str(e))
    except Exception:  # noqa: BLE001 - any other problem of the trunk's parameters is reported where it is built
        pass


def _check_param_names(
    entry: Any, names: dict[str, Any], path: tuple, report: _Reporter, exclude: tuple[str, ...] = ()
) -> bool:
    try:
        allowed = [n for n in entry.parameters() if n not in exclude]
    except (ImportError, AttributeError) as e:
        report.add(path, f"{entry.kind} {entry.name!r} cannot be imported: {e}")
        return False
    ok = True
    for name in names:
        if name not in allowed:
            report.add(
                (*path, name),
                f"{entry.kind} {entry.name!r} has no parameter {name!r}: "
                f"expected one of {', '.join(allowed) or '(none)'}",
            )
            ok = False
    return ok


def _merge_search_space(entry: Any, item: dict[str, Any], path: tuple, report: _Reporter) -> dict | None:
    """Registry defaults, overridden key by key by the protocol; `null` removes; fixed params are not searched."""
    override = item["search_space"]
    ok = _check_param_names(entry, override, (*path, "search_space"), report)
    ok = _check_param_names(entry, item["params"], (*path, "params"), report) and ok
    inherited = {k: v for k, v in entry.search_space.items() if k not in override}  # the entry's own defaults
    ok = _check_param_names(entry, inherited, (*path, "search_space"), report) and ok
    if not ok:
        return None
    merged = {k: copy.deepcopy(v) for k, v in entry.search_space.items()}
    for name, dist in override.items():
        if dist is None:
            merged.pop(name, None)
            continue
        if name in item["params"]:
            report.add((*path, "search_space", name), f"{name!r} is also fixed in params: fix it or search it")
        merged[name] = {**({"log": False} if dist["type"] != "categorical" else {}), **dist}
        problem = _distribution_problem(merged[name])
        if problem:
            report.add((*path, "search_space", name), problem)
    for name in item["params"]:
        merged.pop(name, None)
    return dict(sorted(merged.items()))


def _distribution_problem(dist: dict[str, Any]) -> str | None:
    if dist["type"] == "categorical":
        return None
    low, high = dist["low"], dist["high"]
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"expected finite bounds, got low={low}, high={high}"
    if low > high:
        return f"expected low <= high, got low={low}, high={high}"
    if dist.get("log") and low <= 0:
        return f"a log-scale range needs low > 0, got low={low}"
    if dist.get("log") and dist.get("step"):
        return "step and log cannot be combined"
    return None


def _try_build(
    kind: str, entry: Any, item: dict[str, Any], doc: dict[str, Any], path: tuple, report: _Reporter
) -> None:
    """Build the method with its fixed parameters: a bad value (a misspelt choice) fails now, not mid-sweep.
    Then once with each categorical choice of its search space: an unknown choice would otherwise fail
    every trial that draws it, and a sweep whose trials all fail still said "cells done"."""
    problem = _build_problem(kind, entry, item["params"], doc)
    if problem is not None:
        report.add((*path, problem[0]), problem[1])
        return
    for name, dist in item["search_space"].items():
        if not isinstance(dist, dict) or dist.get("type") != "categorical":
            continue
        for choice in dist["choices"]:
            problem = _build_problem(kind, entry, {**item["params"], name: choice}, doc)
            if problem is not None:
                report.add((*path, "search_space", name), f"choice {choice!r} cannot be used: {problem[1]}")
                break


def _build_problem(kind: str, entry: Any, fixed: dict[str, Any], doc: dict[str, Any]) -> tuple[str, str] | None:
    """Where and what, if the method cannot be built with ``fixed``."""
    import torch

    from bench.cell import build_methods, planned_classes

    model = doc["model"]
    params = method_params(entry, fixed, model)
    loss, miner = (entry.name, None) if kind == "loss" else (None, entry.name)
    try:
        with torch.random.fork_rng(devices=[]):  # a learned metric draws its weights: leave the RNG as it was
            build_methods(
                loss,
                params if loss else {},
                miner,
                params if miner else {},
                num_classes=planned_classes(doc["training"]["P"]),
                embedding_dim=model["embedding_dim"],
            )
    except BenchError as e:
        return "params", str(e)
    except ImportError as e:
        return "name", f"{kind} {entry.name!r} cannot be imported: {e}"
    return None


def _check_served_batch(
    entry: Any, item: dict[str, Any], training: dict[str, Any], path: tuple, report: _Reporter
) -> None:
    """A dataset-level miner may not serve more samples a step than P x K: the budget counts samples too."""
    served = entry.batch
    if served is None or not entry.dataset_level(item["params"]):
        return
    names = served.counts
    if any(n in item["search_space"] for n in names):
        report.add(
            (*path, "search_space"),
            f"{', '.join(names)} set the batch size of {entry.name}: fix them in "
            "params, the batch is part of the budget",
        )
        return
    params = entry.settings(item["params"])
    per_tuple = served.size(params)
    tuples = sum(int(params[n]) for n in names)
    largest, batch = tuples * per_tuple, training["P"] * training["K"]
    if largest > batch:
        report.add(
            (*path, "params"),
            f"{entry.name} serves up to {largest} samples a step ({per_tuple} x "
            f"({' + '.join(f'{n}={params[n]}' for n in names)})), more than the batch P x K = {batch}: "
            f"lower {' and '.join(names)} so every method sees at most {batch} samples a step",
        )


def _check_batch_needs(entry: Any, training: dict[str, Any], path: tuple, report: _Reporter) -> None:
    """The classes and samples per class a P x K batch must hold for this method to find any tuple."""
    if training["P"] < entry.min_classes:
        report.add(
            (*path, "name"),
            f"{entry.kind} {entry.name!r} needs at least {entry.min_classes} classes a "
            f"batch: training.P is {training['P']}",
        )
    if training["K"] < entry.min_per_class:
        report.add(
            (*path, "name"),
            f"{entry.kind} {entry.name!r} needs at least {entry.min_per_class} samples "
            f"of each class a batch: training.K is {training['K']}",
        )


def _check_supplied(doc: dict[str, Any], written: dict[int, list[str]], report: _Reporter) -> None:
    """A loss parameter searched in the protocol but supplied by every miner it is paired with is dead:
    the miner's tuples override it, so its search would only add noise. Refused, naming the miners."""
    from bench import registry

    miners = {m["label"]: m for m in doc["grid"]["miners"]}
    for i, item in enumerate(doc["grid"]["losses"]):
        explicit = written.get(i, [])
        if not explicit:
            continue
        try:
            loss = registry.get("loss", item["name"])
            paired = []
            for label in item.get("miners", list(miners)):
                name = miners[label]["name"] if label in miners else NO_MINER
                entry = None if name == NO_MINER else registry.get("miner", name)
                if registry.incompatibility(loss, entry) is None:
                    paired.append(entry)
        except BenchError:
            continue  # an unknown name is reported where it is written
        for key in explicit:
            suppliers = [m.name for m in paired if m is not None and key in m.supplies]
            if paired and len(suppliers) == len(paired):
                report.add(
                    ("grid", "losses", i, "search_space", key),
                    f"{key!r} is supplied by the miner's tuples ({', '.join(suppliers)}) in every cell of "
                    f"{item['label']}: searching it has no effect; remove it from search_space",
                )


def method_params(entry: Any, fixed: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """`bench.cell.method_params` with the ``model`` section of a protocol document."""
    from bench.cell import method_params as with_choices

    return with_choices(entry, fixed, model["normalize"], model.get("distance"))
