"""Every shipped protocol and every committed result keeps its hash.

A protocol's hash keys every record a sweep wrote (Optuna studies, MLflow
runs, table rows, the manifest); code that reads the protocol differently
must not hash it differently, or every committed result would stop matching
its protocol. The expected values were computed from the files as shipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.plan.grid import plan
from bench.plan.types import cell_key
from bench.protocol import load_protocol, parse_protocol

ROOT = Path(__file__).resolve().parents[2]

# file under protocols/ -> (protocol hash, shared hash), 12 hex each
PINNED = {
    "fashion-mnist-2d.yaml": ("4108208131a8", "84f0c96b985a"),
    "inshop.yaml": ("9c79d93e2297", "57ccfdb0b52d"),
    "market1501-batch-hard.yaml": ("d817020c75b7", "033ea8142d39"),
    "omniglot-demo.yaml": ("7d56fd8712d9", "236b928bfe40"),
    "omniglot-full.yaml": ("f30213de2382", "167d5c553369"),
    "omniglot-mlrc.yaml": ("6735f0f4a45d", "72deb0ff8b0a"),
    "omniglot-quick.yaml": ("4b7f40195b11", "455ae9609074"),
    "omniglot-smoke.yaml": ("73249472d7ea", "998aea3a4a2e"),
    "omniglot-standard.yaml": ("6b03d10fd0ca", "a846eb51ef8c"),
    "omniglot-standard-sha.yaml": ("7a8dbd9cda4f", "a6ff341e40a9"),
    "omniglot-converged.yaml": ("27a086db66f1", "f414b0cf471c"),
    "omniglot-quick-repeats.yaml": ("d06d53e35bf1", "bbf1f88911cf"),
    "reality-check-cars.yaml": ("9063118887f4", "a547d51831ac"),
    "reality-check-cub.yaml": ("7138d8db6ba4", "5b1826b5c762"),
    "reality-check-sop.yaml": ("f2adf53a6632", "b3d1a629de47"),
}

MANIFESTS = sorted((ROOT / "results").glob("*/manifest.json"))


def test_every_shipped_protocol_is_pinned():
    assert sorted(p.name for p in (ROOT / "protocols").glob("*.yaml")) == sorted(PINNED)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_shipped_protocol_keeps_its_hash(name):
    protocol = load_protocol(ROOT / "protocols" / name)
    assert (protocol.hash12, protocol.shared_hash[:12]) == PINNED[name]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[m.parent.name for m in MANIFESTS])
def test_committed_result_keeps_its_hashes(manifest):
    """The protocol text a result recorded hashes to the hash it recorded, and its cells to their keys."""
    record = json.loads(manifest.read_text())
    protocol = parse_protocol(record["protocol_text"], record["protocol_file"])
    assert protocol.hash == record["protocol_hash"]
    if "shared_hash" in record:
        assert protocol.shared_hash == record["shared_hash"]
    if "cell_keys" in record:
        bound = protocol.with_data(record["data_fingerprint"])
        assert {c.id: cell_key(bound, c) for c in plan(bound).cells} == record["cell_keys"]


def test_results_are_there():
    assert len(MANIFESTS) >= 4  # the test above is not vacuous


@pytest.mark.parametrize("name", sorted(PINNED))
def test_typed_sections_say_what_the_document_says(name):
    """`Protocol.spec` is the normalised document, section by section, the absent defaults filled in."""
    protocol = load_protocol(ROOT / "protocols" / name)
    doc, spec = protocol.doc, protocol.spec
    assert spec.name == doc["name"] and spec.seed == doc["seed"]
    assert spec.data.train == doc["data"]["train"] and spec.data.test == doc["data"]["test"]
    assert spec.data.validation.use == doc["data"]["validation"]["use"]
    assert spec.data.small_classes == doc["data"].get("small_classes", "refuse")
    assert spec.model.pretrained == doc["model"].get("pretrained")
    assert spec.model.freeze_bn == doc["model"].get("freeze_bn", False)
    assert spec.training.iterations == doc["training"]["iterations"]
    assert spec.training.batch_size == doc["training"]["P"] * doc["training"]["K"]
    assert spec.training.trunk_lr == doc["training"].get("trunk_lr")
    stopping = doc["training"].get("early_stopping")
    assert (spec.training.early_stopping is None) == (not stopping)
    assert list(spec.evaluation.metrics) == doc["evaluation"]["metrics"]
    assert spec.evaluation.precision == doc["evaluation"].get("precision", "fp32")
    assert spec.tuning.pruner.type == doc["tuning"]["pruner"]["type"]
    assert spec.tuning.repeats == doc["tuning"].get("repeats", 1)
    seeds = doc["final"]["seeds"]
    if isinstance(seeds, dict):  # a range: every seed it may train, and the rule
        assert list(spec.final.seeds) == list(range(seeds["max"])) and spec.final.seed_range is not None
        assert (spec.final.seed_range.min, spec.final.seed_range.half_width) == (seeds["min"], seeds["half_width"])
    else:
        assert list(spec.final.seeds) == seeds and spec.final.seed_range is None
    assert spec.final.mode == doc["final"].get("mode", "retrain")
    assert [m.label for m in spec.grid.losses] == [m["label"] for m in doc["grid"]["losses"]]
    assert [m.search_space for m in spec.grid.miners] == [m["search_space"] for m in doc["grid"]["miners"]]


def test_typed_sections_cannot_alter_the_hash():
    protocol = load_protocol(ROOT / "protocols" / "omniglot-quick.yaml")
    protocol.spec.grid.losses[0].params["margin"] = 123.0
    protocol.spec.model.trunk_params["x"] = 1
    assert "margin" not in protocol.doc["grid"]["losses"][0]["params"]
    assert protocol.hash12 == PINNED["omniglot-quick.yaml"][0]
    with pytest.raises(AttributeError):
        protocol.spec.training.iterations = 1  # type: ignore[misc]


def test_only_the_protocol_package_reads_the_raw_document():
    """Outside bench/protocol the package reads `Protocol.spec`, never `.doc` (what the hash covers)."""
    import ast

    bench = ROOT / "bench"
    reads = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in bench.rglob("*.py")
        if path.parent.name != "protocol"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "doc"
    ]
    assert reads == []
