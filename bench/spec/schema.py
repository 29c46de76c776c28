"""The JSON schema of a protocol file, its defaults, and readable errors.

The schema is the single statement of what a protocol may say; `validate`
and `run` both check it before anything is loaded or trained, so a typo
costs a second, not an hour of sweep. Defaults live here too (`DEFAULTS`)
because a protocol's hash is taken after they are filled in: writing a
default out explicitly must not make another protocol.
"""

from __future__ import annotations

import math
import re
from typing import Any

from bench.devices import AUTO, FLOAT32_MAX, PRECISIONS

_NUM = {"type": "number"}
_POS_INT = {"type": "integer", "minimum": 1}
# a count of runs (trials, seeds): far past any budget, and a bound that keeps a typo (1e12) from filling memory
MAX_RUNS = 100_000
_RUNS = {"type": "integer", "minimum": 1, "maximum": MAX_RUNS}
# \Z, not $: Python's $ also matches before a final newline, and "tiny\n" would pass as a name;
# at most 100 characters, so a name stays a valid file name (results/<name>/, <name>.yaml)
_NAME = {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z"}
_PARAMS = {"type": "object"}  # names checked against the registry, values by the constructor

RETRIEVAL_METRICS = ("precision_at_1", "r_precision", "map_at_r", "recall_at_k")
REID_METRICS = ("reid_map", "cmc_at_k")  # Market-1501's rules: need data.test {query, gallery} with cameras
METRICS = (*RETRIEVAL_METRICS, "nmi", "ami", "lake_accuracy", *REID_METRICS)

# data.test: one dataset that retrieves itself, or a query set ranked against a separate gallery.
TEST_DATA = {
    "oneOf": [
        {"type": "string"},
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["query", "gallery"],
            "properties": {"query": {"type": "string"}, "gallery": {"type": "string"}},
        },
    ]
}

# training.early_stopping: validation scored every check_every iterations, the best checkpoint kept, the run
# stopped after `patience` checks without improvement; max_iterations equals training.iterations (the budget).
EARLY_STOPPING = {
    "type": ["object", "null"],  # null: absent (fixed iterations)
    "additionalProperties": False,
    "required": ["metric", "patience", "check_every", "max_iterations"],
    "properties": {
        "metric": {"enum": list(RETRIEVAL_METRICS[:3])},
        "patience": _POS_INT,
        "check_every": _POS_INT,
        "max_iterations": _POS_INT,
    },
}

DISTRIBUTION = {
    "oneOf": [
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["type", "low", "high"],
            "properties": {
                "type": {"const": "float"},
                "low": _NUM,
                "high": _NUM,
                "log": {"type": "boolean"},
                "step": {"type": "number", "exclusiveMinimum": 0},
            },
        },
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["type", "low", "high"],
            "properties": {
                "type": {"const": "int"},
                "low": {"type": "integer"},
                "high": {"type": "integer"},
                "log": {"type": "boolean"},
                "step": _POS_INT,
            },
        },
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["type", "choices"],
            "properties": {
                "type": {"const": "categorical"},
                "choices": {"type": "array", "minItems": 1, "items": {"type": ["string", "number", "boolean", "null"]}},
            },
        },
    ]
}

# A search-space entry may be `null` to remove a registry default from the search.
SEARCH_SPACE = {"type": "object", "additionalProperties": {"oneOf": [*DISTRIBUTION["oneOf"], {"type": "null"}]}}

METHOD = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "label": _NAME,
        "params": _PARAMS,
        "search_space": SEARCH_SPACE,
        "miners": {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": True},
    },
}

CLASSES = {
    "oneOf": [
        {"type": "null"},
        {"type": "integer", "minimum": 2},
        {"type": "array", "items": {"type": ["integer", "string"]}, "minItems": 2, "uniqueItems": True},
    ]
}

# One dataset split for the user: test_classes is a count (an integer >= 2) or a fraction in (0, 1).
SPLIT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["test_classes"],
    "properties": {
        "test_classes": {"type": "number", "exclusiveMinimum": 0},
        "seed": {"type": "integer", "minimum": 0},
    },
}

# How images of any size and aspect ratio become the trunk's square input, the same for train and test.
RESIZE_MODES = ("stretch", "pad", "center_crop")
CHANNELS = {"1": 1, "grey": 1, "gray": 1, "3": 3, "rgb": 3}

# The learning-rate schedule; bench.training.schedule_problem checks what a schema cannot (warmup < budget).
SCHEDULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type"],
    "properties": {
        "type": {"enum": ["constant", "cosine", "step", "exponential"]},
        "warmup": {"type": "integer", "minimum": 0},
        "gamma": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "milestones": {
            "type": "array",
            "items": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "minItems": 1,
            "uniqueItems": True,
        },
        "start": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    },
    "allOf": [
        {"if": {"properties": {"type": {"const": "step"}}}, "then": {"required": ["gamma", "milestones"]}},
        {"if": {"properties": {"type": {"const": "exponential"}}}, "then": {"required": ["gamma", "start"]}},
    ],
}

# data.augment: transforms.v2 class names (bench.data.augment.ALLOWED), bare or {Name: {kwargs}}
AUGMENT_LIST: dict[str, Any] = {
    "type": "array",
    "items": {
        "anyOf": [
            {"type": "string"},
            {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 1,
                "additionalProperties": {"type": ["object", "null"]},
            },
        ]
    },
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "data", "model", "training", "evaluation", "tuning", "final", "grid"],
    "properties": {
        "name": _NAME,
        "description": {"type": "string"},
        "seed": {"type": "integer", "minimum": 0},
        "data": {
            "type": "object",
            "additionalProperties": False,
            "required": ["image_size", "validation"],
            "properties": {
                "train": {"type": "string"},
                "test": TEST_DATA,
                "pool": {"type": "string"},
                "split": SPLIT,
                "resize": {"enum": list(RESIZE_MODES)},
                "channels": {"enum": [None, 1, 3, "grey", "gray", "rgb"]},
                "layout": {"enum": ["nchw", "nhwc"]},  # how an npz's 4-D x is ordered (absent: NCHW, checked)
                "train_classes": CLASSES,
                "test_classes": CLASSES,
                # a side, or [height, width] for image files whose data.augment pipelines end there
                "image_size": {"anyOf": [_POS_INT, {"type": "array", "items": _POS_INT, "minItems": 2, "maxItems": 2}]},
                "min_samples_per_class": {"type": "integer", "minimum": 2},
                "small_classes": {"enum": ["refuse", "drop"]},
                "augmentation": {"enum": [None, "shift", "affine"]},
                "augment": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"train": AUGMENT_LIST, "eval": AUGMENT_LIST},
                },
                "loader": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "workers": {"type": ["integer", "null"], "minimum": 0},
                        "pin_memory": {"type": ["boolean", "null"]},
                        "cache": {"type": ["boolean", "null"]},
                        "cache_max_gb": {"type": ["number", "null"], "exclusiveMinimum": 0},
                        "augment_on": {"enum": ["workers", "device", None]},
                    },
                },
                "validation": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["folds"],
                    "properties": {
                        "folds": {"type": "integer", "minimum": 2},
                        "use": {"type": ["integer", "null"], "minimum": 1},  # null: every fold
                        "group_by": {"type": ["string", "null"]},
                    },
                },
            },
        },
        "model": {
            "type": "object",
            "additionalProperties": False,
            "required": ["trunk", "embedding_dim", "normalize"],
            "properties": {
                "trunk": {"type": "string"},
                "trunk_params": _PARAMS,
                "embedding_dim": _POS_INT,
                "normalize": {"type": "boolean"},
                "distance": {"enum": [None, "euclidean", "squared_euclidean", "cosine"]},
                "pretrained": {"type": ["string", "null"], "minLength": 1},
                "freeze_bn": {"type": "boolean"},
            },
        },
        "training": {
            "type": "object",
            "additionalProperties": False,
            "required": ["optimizer", "lr", "P", "K", "iterations"],
            "properties": {
                "optimizer": {"enum": ["adam", "sgd", "rmsprop"]},
                # a rate or decay past FLOAT32_MAX: the optimisers hold it as float32, their first step overflows
                "lr": {"type": "number", "exclusiveMinimum": 0, "maximum": FLOAT32_MAX},
                "trunk_lr": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": FLOAT32_MAX},
                "weight_decay": {"type": "number", "minimum": 0, "maximum": FLOAT32_MAX},
                "P": {"type": "integer", "minimum": 2},
                "K": {"type": "integer", "minimum": 2},
                "short_classes": {"enum": ["repeat", "refuse"]},
                "iterations": _POS_INT,
                "device": {"type": "string"},
                "precision": {"enum": [*PRECISIONS, AUTO]},
                "channels_last": {"type": ["boolean", "null"]},
                "schedule": SCHEDULE,
                "early_stopping": EARLY_STOPPING,
            },
        },
        "evaluation": {
            "type": "object",
            "additionalProperties": False,
            "required": ["metrics", "primary"],
            "properties": {
                "metrics": {"type": "array", "items": {"enum": list(METRICS)}, "minItems": 1, "uniqueItems": True},
                "primary": {"enum": list(RETRIEVAL_METRICS[:3])},
                "ks": {"type": "array", "items": _POS_INT, "minItems": 1, "uniqueItems": True},
                "precision": {"enum": ["fp32", "training"]},
            },
        },
        "tuning": {
            "type": "object",
            "additionalProperties": False,
            "required": ["trials"],
            "properties": {
                "trials": _RUNS,
                "repeats": _RUNS,
                "unsearched": {"enum": ["all", "one"]},
                "startup_trials": {"type": "integer", "minimum": 0},
                # multi-fidelity tuning, one rung schedule for every cell (bench.plan.rungs): trials configurations
                # trained min_iterations each, the best 1/eta of them eta times longer, ... up to
                # training.iterations; synchronous, so every cell trains exactly the same iterations
                "strategy": {
                    "type": ["object", "null"],  # null: absent (every trial trains the whole budget)
                    "additionalProperties": False,
                    "required": ["type", "min_iterations"],
                    "properties": {
                        "type": {"enum": ["successive_halving"]},
                        "min_iterations": _POS_INT,
                        "max_iterations": _POS_INT,
                        "eta": {"type": "integer", "minimum": 2},
                    },
                },
                "pruner": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["type"],
                    "properties": {
                        "type": {"enum": ["none", "median", "successive_halving"]},
                        "check_every": _POS_INT,
                        "startup_trials": {"type": "integer", "minimum": 0},
                        "warmup_steps": {"type": "integer", "minimum": 0},
                        "min_resource": _POS_INT,
                        "reduction_factor": {"type": "integer", "minimum": 2},
                    },
                },
            },
        },
        "final": {
            "type": "object",
            "additionalProperties": False,
            "required": ["seeds"],
            "properties": {
                "keep_models": {"type": "boolean"},
                "seeds": {
                    "oneOf": [
                        _RUNS,
                        {
                            "type": "array",
                            "items": {"type": "integer", "minimum": 0},
                            "minItems": 1,
                            "maxItems": MAX_RUNS,
                            "uniqueItems": True,
                        },
                        # a range: seeds 0, 1, ... added in order until the 95% t-interval of the primary metric
                        # has a half-width <= half_width, at least min and at most max (bench.sweep.seed_rule)
                        {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["min", "max", "half_width"],
                            "properties": {
                                "min": {"type": "integer", "minimum": 2},
                                "max": _RUNS,
                                "half_width": {"type": "number", "exclusiveMinimum": 0},
                            },
                        },
                    ]
                },
                # retrain: the best parameters retrained on every training class, one model per seed; folds: the
                # Reality Check's procedure, one model per validation fold (each early-stopped on its own fold
                # under training.early_stopping), scored alone ("separate") and concatenated ("concatenated")
                "mode": {"enum": ["retrain", "folds"]},
            },
        },
        "grid": {
            "type": "object",
            "additionalProperties": False,
            "required": ["losses"],
            "properties": {
                "losses": {"type": "array", "items": METHOD, "minItems": 1},
                "miners": {"type": "array", "items": METHOD, "minItems": 1},
            },
        },
    },
}

# Filled in before hashing (dotted path -> value); see the module docstring.
DEFAULTS: dict[str, Any] = {
    "description": "",
    "seed": 0,
    "data.train_classes": None,
    "data.test_classes": None,
    "data.min_samples_per_class": 2,
    "data.augmentation": None,
    "data.validation.use": None,  # None: every fold
    "data.validation.group_by": None,
    "model.trunk_params": {},
    "model.distance": None,  # None: each method's own default distance
    "training.weight_decay": 0.0,
    "training.device": "cpu",
    "training.precision": "fp32",
    "training.channels_last": None,  # None: on for images when precision is bf16 or fp16
    "training.schedule": {"type": "constant"},
    "training.schedule.warmup": 0,  # filled after the line above, so inside any schedule
    "evaluation.ks": [1, 2, 4, 8],
    "tuning.startup_trials": 10,
    "tuning.pruner": {"type": "none"},
    "grid.miners": [{"name": "none"}],
}

# Keys whose default is their absence (dotted path -> default): written out at the default they are dropped
# (bench.protocol._defaults), so protocols from before they existed keep their hash; read them with `setting`.
ABSENT_DEFAULTS: dict[str, Any] = {
    "model.pretrained": None,  # None: random initialisation
    "model.freeze_bn": False,
    "training.trunk_lr": None,  # None: training.lr for the whole trunk
    "data.layout": None,  # None: an npz's 4-D x is (N, C, H, W), and one that looks channels-last is refused
    "data.small_classes": "refuse",  # a class below data.min_samples_per_class: refused (drop: left out, counted)
    "training.short_classes": "repeat",  # a class with fewer than K images: drawn with replacement (PML's way)
    "training.early_stopping": None,  # None: every run trains training.iterations
    "final.mode": "retrain",  # the best parameters retrained on all training classes, one model per final seed
    "tuning.strategy": None,  # None: every trial trains the whole budget (successive_halving: bench.plan.rungs)
    "tuning.repeats": 1,  # tuning draws: the whole tuning stage run once (R > 1: R independent draws, each retrained)
    # a cell with nothing searched: "all" gives it tuning.trials trials, which differ by seed alone (the best is
    # the luckiest seed); "one" gives it one trial. Absent is "all", which protocols written before it ran.
    "tuning.unsearched": "all",
    # the trunk's forward when it embeds for scoring (validation, test, floor, artifacts): fp32 whatever training
    # ran in, or "training", the sweep's training precision (autocast; fp32 training embeds in fp32 either way)
    "evaluation.precision": "fp32",
    # each final seed's model and test embeddings kept as MLflow artifacts (bench.sweep.kept); false for large
    # trunks. What is kept changes no result, so the key is in no hash (bench.protocol.hashing.HASH_EXCLUDED)
    "final.keep_models": True,
}


def setting(doc: dict[str, Any], dotted: str) -> Any:
    """A key of ``ABSENT_DEFAULTS`` in a normalised protocol document: its value, or its default."""
    section, key = dotted.split(".")
    return doc[section].get(key, ABSENT_DEFAULTS[dotted])


PRUNER_DEFAULTS: dict[str, Any] = {
    "check_every": None,  # None: the training budget / 4
    "startup_trials": 2,
    "warmup_steps": 0,
    "min_resource": 1,
    "reduction_factor": 3,
}


def error_path(error: Any) -> tuple:
    """Where the problem is; a missing key is named as if it were there."""
    path = tuple(error.absolute_path)
    if error.validator == "required":
        match = re.match(r"^'(.+)' is a required property$", error.message)
        if match:
            return (*path, match.group(1))
    return path


def describe_error(error: Any) -> str:
    """One sentence for a jsonschema error: what was expected, in the protocol's own words."""
    v, value, expected = error.validator, error.instance, error.validator_value
    if v == "required":
        return "missing: a required key"
    if v == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(value) - set(allowed))
        return f"unknown key {extra[0]!r}: expected one of {', '.join(allowed)}" if extra else error.message
    if v == "type":
        kinds: list[str] = expected if isinstance(expected, list) else [expected]
        return f"expected {' or '.join(_ARTICLE.get(k, k) for k in kinds)}, got {_show(value)}"
    if v == "enum":
        return f"expected one of {', '.join('null' if e is None else str(e) for e in expected)}, got {_show(value)}"
    if v == "const":
        return f"expected {expected!r}, got {_show(value)}"
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        if isinstance(value, float) and not math.isfinite(value):  # .inf meets a bound before the finite check
            return f"expected a finite number, got {_show(value)}"
        sign = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[v]
        return f"expected a value {sign} {expected}, got {_show(value)}"
    if v == "minItems":
        return f"expected at least {expected} item(s), got {len(value)}"
    if v == "maxItems":
        return f"expected at most {expected} item(s), got {len(value)}"
    if v == "uniqueItems":
        return f"expected distinct items, got {_show(value)}"
    if v == "pattern":
        return f"expected a name of at most 100 letters, digits, '_', '.', '-' (no newline), got {_show(value)}"
    if v == "oneOf":
        return _one_of(error)
    return error.message


def _one_of(error: Any) -> str:
    """For a search-space distribution say which `type` exists; else list what would have been accepted."""
    value = error.instance
    branches = error.validator_value
    if isinstance(value, dict) and any(b.get("properties", {}).get("type", {}).get("const") for b in branches):
        if value.get("type") not in ("float", "int", "categorical"):
            return f"expected a distribution with type float, int or categorical, got {_show(value.get('type'))}"
        for sub in error.context or ():
            branch = branches[sub.relative_schema_path[0]]
            if branch.get("properties", {}).get("type", {}).get("const") == value["type"] and sub.validator != "const":
                where = ".".join(map(str, error_path(sub)[len(error.absolute_path) :]))
                return f"{where + ': ' if where else ''}{describe_error(sub)} (in a {value['type']} distribution)"
    # a value of the kind exactly one choice takes (a mapping, a list, an integer): say what is wrong in it
    kinds = _json_kinds(value)
    matching = [i for i, b in enumerate(branches) if b.get("type") in kinds]
    if len(matching) == 1:
        for sub in error.context or ():
            if sub.relative_schema_path[0] == matching[0]:
                where = ".".join(map(str, error_path(sub)[len(error.absolute_path) :]))
                return f"{where + ': ' if where else ''}{describe_error(sub)}"
    return f"expected {_alternatives(error.validator_value)}, got {_show(value)}"


def _json_kinds(value: Any) -> set[str]:
    """The JSON Schema types a YAML value has (an integer is a number too)."""
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    if isinstance(value, list):
        return {"array"}
    if isinstance(value, dict):
        return {"object"}
    if isinstance(value, str):
        return {"string"}
    return {"null"} if value is None else set()


def _alternatives(options: list[dict[str, Any]]) -> str:
    words = []
    for option in options:
        t = option.get("type")
        if t == "array":
            words.append("a list")
        elif t:
            words.append(_ARTICLE.get(t, t))
    return " or ".join(dict.fromkeys(words)) or "another value"


_ARTICLE = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list" if len(repr(value)) > 40 else repr(value)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def image_hw(size: Any) -> tuple[int, int]:
    """``data.image_size`` as (height, width): a side for square images, or [height, width] (re-ID's 256 x 128)."""
    if isinstance(size, (list, tuple)):
        h, w = size
        return int(h), int(w)
    return int(size), int(size)
