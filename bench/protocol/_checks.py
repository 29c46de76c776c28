"""What a schema cannot say of a protocol: registry names, cross-field rules, what the trainer would refuse.

Each check adds its problems to the `Reporter` at the key path they are
about, so one ProtocolError lists them all. Modules that import torch
(the trainer, trunks, data) are imported inside the checks that need them,
so importing the protocol package stays light.
"""

from __future__ import annotations

from typing import Any

from bench import registry
from bench.devices import precision_problem
from bench.errors import BenchError
from bench.protocol._methods import check_methods, check_param_names, entry_or_report
from bench.protocol._report import Reporter
from bench.spec.schema import METRICS, REID_METRICS, RETRIEVAL_METRICS, image_hw, setting


def check_data_sources(data: dict[str, Any], report: Reporter) -> None:
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


def check_semantics(doc: dict[str, Any], report: Reporter) -> None:
    """What a schema cannot say: registry names and parameters, ranges, cross-references."""
    model = doc["model"]
    trunk = entry_or_report("trunk", model["trunk"], ("model", "trunk"), report)
    if trunk is not None:
        if check_param_names(
            trunk, model["trunk_params"], ("model", "trunk_params"), report, exclude=("in_shape", "embedding_dim")
        ):
            from bench.trunks import check_size  # torch: imported once a protocol is checked

            h, w = image_hw(doc["data"]["image_size"])
            try:
                check_size(model["trunk"], (1, h, w), model["embedding_dim"], model["trunk_params"])
            except BenchError as e:
                small = "too small" in str(e)  # the image, not the trunk, is what the user sets wrong
                report.add(("data", "image_size") if small else ("model",), str(e))
                return  # methods are built with this embedding size below: an absurd one would allocate it
            _check_trunk_options(doc, report)

    check_methods(doc, report)
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


def _check_training(training: dict[str, Any], report: Reporter) -> None:
    """What the trainer would refuse at its first trial, refused at validation: a schedule that does not
    fit the budget, and fp16 on the CPU (no grad scaler there, and slow)."""
    from bench.training import schedule_problem  # torch

    problem = schedule_problem(training["schedule"], training["iterations"])
    if problem:
        report.add(("training", "schedule"), problem)
    problem = precision_problem(training["precision"], str(training["device"]), availability=False)
    if problem:
        report.add(("training", "precision"), problem)


def _check_strategy(doc: dict[str, Any], report: Reporter) -> None:
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


def _check_final_mode(doc: dict[str, Any], report: Reporter) -> None:
    """``final.mode: folds`` trains one final model per validation fold the trials use, and concatenates them:
    it needs two folds at least (one fold model concatenated is that model)."""
    use = doc["data"]["validation"]["use"]
    if setting(doc, "final.mode") == "folds" and use < 2:
        report.add(
            ("final", "mode"),
            f"folds needs at least 2 validation folds in use (data.validation), got {use}: "
            "with one, 'concatenated' is the one fold model; use mode retrain",
        )


def _check_early_stopping(doc: dict[str, Any], report: Reporter) -> None:
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


def _check_trunk_options(doc: dict[str, Any], report: Reporter) -> None:
    """model.pretrained, model.freeze_bn and training.trunk_lr against the trunk (bench.models.trunk)."""
    from bench.trunks import option_problems  # torch

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


def _check_data_classes(data: dict[str, Any], report: Reporter) -> None:
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


def _check_augment(data: dict[str, Any], report: Reporter) -> None:
    """Every named transform built once (torchvision imported only when a protocol names one)."""
    if "augment" not in data:
        return
    from bench.data.augment import check  # torchvision

    try:
        check(data["augment"])
    except BenchError as e:
        report.add(("data", "augment"), str(e))


def _check_query_gallery(doc: dict[str, Any], report: Reporter) -> None:
    """What a ``data.test`` of a query and a gallery allows (whether the data has cameras is checked on the
    data): both sets are used whole; the re-ID metrics need them; clustering and Lake's runs need one set."""
    from bench.data.query_gallery import is_query_gallery  # bench.data: torch

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


def _check_image_size(doc: dict[str, Any], trunk: Any, report: Reporter) -> None:
    """An image side every trunk can take: too small for the trunk is found now (built on the meta device,
    so nothing is allocated), not as a failure of every trial."""
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
        import torch  # only here: importing the protocol package must not import torch

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
