"""Methods from outside bench/: an installed entry-point package, a --plugin file, any PML class by name.

The installed package is found by real entry-point discovery: its
directory and a ``*.dist-info`` (written from its own pyproject.toml) are put
on sys.path, which is what ``pip install -e`` amounts to for importlib.metadata.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import tomllib
import torch

from bench import registry
from bench.cli import main
from bench.errors import BenchError
from bench.plugins import load_plugin
from bench.protocol import load_protocol
from bench.protocol.hashing import canonical_json
from bench.registry import _lookup

PKG = Path(__file__).parent / "plugin_pkg"
FILE = str(PKG / "my_methods.py")
MODULES = ("dmlbench_example_plugin", "dmlbench_plugin_my_methods")

PROTOCOL = """
name: plugins-tiny
seed: 0
data: {{train: omniglot:background, test: omniglot:evaluation, train_classes: 10, test_classes: 6, image_size: 14,
        validation: {{folds: 3, use: 1}}}}
model: {{trunk: mlp, trunk_params: {{hidden: [32]}}, embedding_dim: 8, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 5, K: 4, iterations: 8}}
evaluation: {{metrics: [precision_at_1, map_at_r], primary: map_at_r}}
tuning: {{trials: 1, startup_trials: 1}}
final: {{seeds: 2}}
grid:
  losses:
    - {{name: plugin_triplet, miners: [none, file_hardest]}}
    - {{name: {second}, miners: [none]}}
  miners: [{{name: none}}, {{name: file_hardest}}]
"""
CELLS = {"plugin_triplet+none", "plugin_triplet+file_hardest", "file_contrastive+none"}


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The example package as pip would leave it: importable, with its entry points in a dist-info."""
    project = tomllib.loads((PKG / "pyproject.toml").read_text())["project"]
    info = tmp_path / "site" / f"dmlbench_example_plugin-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text(
        "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in groups.items())
    )
    monkeypatch.syspath_prepend(str(PKG))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield project
    _fresh_process()


def _fresh_process() -> None:
    """Forget every plugin entry and module, as a new `dmlbench` process (a second worker) starts."""
    for key in [k for k, e in _lookup._REGISTERED.items() if e.plugin]:
        del _lookup._REGISTERED[key]
    for name in MODULES:
        sys.modules.pop(name, None)


def _listed(capsys: pytest.CaptureFixture, *args: str) -> dict[str, dict]:
    capsys.readouterr()
    assert main([*args, "list", "--format", "json"]) == 0
    return {r["name"]: r for r in json.loads(capsys.readouterr().out)}


def test_an_installed_plugin_is_found_lazily_and_listed_with_its_package(installed, capsys):
    assert "dmlbench_example_plugin" not in sys.modules  # nothing imported before a lookup
    assert "plugin_triplet" in registry.names("loss")  # named from the metadata alone
    assert "dmlbench_example_plugin" not in sys.modules
    rows = _listed(capsys)
    row = rows["plugin_triplet"]
    assert row["source"] == "entry point dmlbench-example-plugin" and row["version"] == installed["version"]
    assert row["reference"] == "pml:TripletMarginLoss" and len(row["source_sha256"]) == 64
    assert rows["triplet"]["source"] == "built-in" and "file_contrastive" not in rows


def test_a_plugin_file_is_listed_only_with_plugin(installed, capsys):
    rows = _listed(capsys, "--plugin", FILE)
    assert rows["file_contrastive"]["source"] == f"--plugin {Path(FILE).resolve()}"
    assert rows["file_hardest"]["kind"] == "miner" and rows["file_hardest"]["reference"] == "pml:BatchHardMiner"
    assert registry.get("miner", "file_hardest").tuples == "triplets"
    assert rows["file_linear"]["kind"] == "trunk" and rows["file_linear"]["parameters"]["bias"] is True
    trunk = registry.build_trunk("file_linear", in_shape=(1, 4, 4), embedding_dim=3)
    assert trunk(torch.zeros(2, 1, 4, 4)).shape == (2, 3)


def test_a_plugin_that_fails_to_import_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "broken.py"
    bad.write_text("import no_such_module_here\n")
    assert main(["--plugin", str(bad), "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "broken.py" in err and "no_such_module_here" in err
    assert main(["--plugin", "no_such_plugin_module", "list"]) == 2
    assert "plugin 'no_such_plugin_module' failed to import" in capsys.readouterr().err
    site = tmp_path / "site" / "broken_pkg-1.0.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-pkg\nVersion: 1.0\n")
    (site / "entry_points.txt").write_text("[dmlbench.losses]\nbroken = no_such_module_either:Loss\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert "entry point 'broken' of package broken-pkg" in err and "no_such_module_either" in err
    assert "Traceback" not in err


def test_register_refuses_a_taken_name_and_a_loss_without_tuples():
    with pytest.raises(BenchError, match="'triplet' is already bench.losses.triplet:TripletLoss"):
        registry.register("loss", "triplet", tuples="triplets")(type("Mine", (), {}))
    with pytest.raises(BenchError, match="must declare tuples="):
        registry.register("loss", "mine")
    with pytest.raises(BenchError, match="name 'pml:x' must be"):
        registry.register("loss", "pml:x", tuples="pairs")


def test_any_pml_loss_or_miner_is_reachable_by_class_name():
    ntxent = registry.get("loss", "pml:NTXentLoss")
    assert ntxent.tuples == "pairs" and ntxent.parameters() == {"temperature": 0.07}
    proxy = registry.get("loss", "pml:ProxyNCALoss")
    assert proxy.tuples == "proxy" and proxy.needs == ("num_classes", "embedding_size")
    miner = registry.build_miner("pml:TripletMarginMiner", margin=0.1, type_of_triplets="hard")
    x, y = torch.randn(12, 4), torch.arange(4).repeat(3)
    a, p, n = miner(x, y)
    assert bool((y[a] == y[p]).all() and (y[a] != y[n]).all())
    loss = registry.build_loss("pml:NTXentLoss", temperature=0.2)
    from pytorch_metric_learning.losses import NTXentLoss

    assert torch.allclose(loss(x, y), NTXentLoss(temperature=0.2)(x, y))
    with pytest.raises(BenchError, match="pytorch_metric_learning.losses has no loss class 'NoSuchLoss'"):
        registry.get("loss", "pml:NoSuchLoss")
    with pytest.raises(BenchError, match="has no miner class"):
        registry.get("miner", "pml:NoSuchMiner")
    with pytest.raises(BenchError, match="pml:NTXentLoss: .*unexpected keyword|has no parameter 'tau'"):
        registry.build_loss("pml:NTXentLoss", tau=1.0)
    assert registry.get("loss", "pml:multi_similarity").search_space  # the hand-wired names keep theirs


def test_crosscheck_compares_plugins_with_their_reference(installed):
    from bench.crosscheck import plugins

    load_plugin(FILE)
    torch.set_default_dtype(torch.float64)
    try:
        results = {r.name: r for r in plugins.checks(cases=12, seed=1)}
    finally:
        torch.set_default_dtype(torch.float32)
    assert set(results) == {
        "loss plugin_triplet (plugin)",
        "loss file_contrastive (plugin)",
        "miner file_hardest (plugin)",
    }
    assert all(r.passed for r in results.values()), results
    assert results["loss plugin_triplet (plugin)"].pml_settings == "pml:TripletMarginLoss(margin=0.05)"


def test_a_changed_reference_fails_the_crosscheck(installed, tmp_path):
    from bench.crosscheck import plugins

    text = Path(FILE).read_text().replace('reference="pml:BatchHardMiner"', 'reference="pml:TripletMarginMiner"')
    changed = tmp_path / "changed_methods.py"
    changed.write_text(text.replace('"file_', '"changed_'))
    load_plugin(str(changed))
    try:
        result = plugins.check(registry.get("miner", "changed_hardest"), cases=8, seed=0)
    finally:
        sys.modules.pop("dmlbench_plugin_changed_methods", None)
    assert not result.passed and "differ" in result.note
    assert torch.get_default_dtype() == torch.float32


def _run(proto: Path, runs: Path, results: Path, data_root: Path, *plugin: str) -> int:
    return main(
        [
            *plugin,
            "run",
            str(proto),
            "--results-dir",
            str(results),
            "--data-root",
            str(data_root),
            "--storage",
            f"sqlite:///{runs / 'optuna.db'}",
            "--tracking-uri",
            str(runs / "mlflow.db"),
            "--quiet",
        ]
    )


def test_plugins_run_a_sweep_survive_a_second_worker_and_reach_the_leaderboard(installed, tmp_path, data_root, capsys):

    proto = tmp_path / "plugins-tiny.yaml"
    proto.write_text(PROTOCOL.format(second="file_contrastive"))
    runs, results = tmp_path / "runs", tmp_path / "results"
    plugin = ("--plugin", FILE)
    assert _run(proto, runs, results, data_root) == 2  # without the file: one line, nothing run
    assert "unknown loss 'file_contrastive'" in capsys.readouterr().err
    assert not (results / "plugins-tiny").exists()

    assert _run(proto, runs, results, data_root, *plugin) == 0
    finals = (results / "plugins-tiny" / "finals.csv").read_bytes()
    manifest = json.loads((results / "plugins-tiny" / "manifest.json").read_text())
    versions = manifest["package_versions"]
    sha = registry.get("loss", "file_contrastive").source_hash
    assert f"sha256:{sha}" in versions["plugin.loss.file_contrastive"]
    assert versions["plugin.loss.plugin_triplet"].startswith(installed["version"])
    # the hash covers the plugin code: not the document's hash alone
    protocol = load_protocol(proto)
    assert (
        manifest["protocol_hash"] == protocol.hash != hashlib.sha256(canonical_json(protocol.doc).encode()).hexdigest()
    )

    # a second worker (or a resume) on the same storage: the same --plugin, nothing retrained, same tables
    _fresh_process()
    assert _run(proto, runs, results, data_root, *plugin) == 0
    assert (results / "plugins-tiny" / "finals.csv").read_bytes() == finals
    # a resume that must rebuild the plugin methods: one cell's records discarded and trained again
    _fresh_process()
    args = [
        *plugin,
        "run",
        str(proto),
        "--results-dir",
        str(results),
        "--data-root",
        str(data_root),
        "--storage",
        f"sqlite:///{runs / 'optuna.db'}",
        "--tracking-uri",
        str(runs / "mlflow.db"),
        "--quiet",
        "--redo",
        "plugin_triplet+file_hardest",
    ]
    assert main(args) == 0
    retrained = pd.read_csv(results / "plugins-tiny" / "finals.csv").drop(columns="wall_time_s")
    first = pd.read_csv(io.BytesIO(finals)).drop(columns="wall_time_s")
    pd.testing.assert_frame_equal(retrained, first)  # the same code and seeds, the same numbers
    table = pd.read_csv(results / "plugins-tiny" / "finals.csv")
    assert set(table["cell"]) == CELLS

    capsys.readouterr()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("dmlbench/plugins-tiny")
    tags = [r.data.tags for r in client.search_runs([experiment.experiment_id])]
    assert tags and all(f"sha256:{sha}" in t["dmlbench.version.plugin.loss.file_contrastive"] for t in tags)
    assert main(["leaderboard", str(results / "plugins-tiny"), "--format", "json"]) == 0
    board = json.loads(capsys.readouterr().out)
    assert {c["cell"] for c in board["cells"]} == CELLS

    out = tmp_path / "from-mlflow"
    args = [
        "leaderboard",
        "--mlflow-experiment",
        "plugins-tiny",
        "--tracking-uri",
        str(runs / "mlflow.db"),
        "--out",
        str(out),
        "--format",
        "json",
    ]
    _fresh_process()
    assert main(args) == 2 and "file_contrastive" in capsys.readouterr().err  # re-reading the protocol needs it
    assert main([*plugin, *args]) == 0
    assert {c["cell"] for c in json.loads(capsys.readouterr().out)["cells"]} == CELLS


def test_a_protocol_of_built_ins_and_pml_classes_keeps_the_document_hash(installed, tmp_path):
    for path in sorted(Path(__file__).parent.parent.glob("protocols/*.yaml")):
        p = load_protocol(path)
        assert p.hash == hashlib.sha256(canonical_json(p.doc).encode()).hexdigest(), path
    proto = tmp_path / "p.yaml"
    proto.write_text(
        PROTOCOL.format(second="pml:NTXentLoss")
        .replace("plugin_triplet", "triplet")
        .replace("[none, file_hardest]", "[none, pml-TripletMarginMiner]")  # a label: no ":"
        .replace("file_hardest", "pml:TripletMarginMiner")
    )
    p = load_protocol(proto)
    assert p.hash == hashlib.sha256(canonical_json(p.doc).encode()).hexdigest()


def test_editing_the_plugin_file_changes_the_protocol_hash(installed, tmp_path):

    mine = tmp_path / "my_methods.py"
    mine.write_text(Path(FILE).read_text())
    proto = tmp_path / "p.yaml"
    proto.write_text(PROTOCOL.format(second="file_contrastive"))
    load_plugin(str(mine))
    before = load_protocol(proto).hash
    _fresh_process()
    mine.write_text(
        Path(FILE).read_text().replace("neg_margin: float = 1.0) -> None", "neg_margin: float = 0.9) -> None")
    )
    load_plugin(str(mine))
    assert load_protocol(proto).hash != before
    _fresh_process()  # the same code loaded from elsewhere (another folder, another worker): the same hash
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "my_methods.py").write_text(mine.read_text())
    load_plugin(str(elsewhere / "my_methods.py"))
    after = load_protocol(proto).hash
    _fresh_process()
    load_plugin(str(mine))
    assert load_protocol(proto).hash == after


class _MarginMiner:
    """A registered miner whose tuples carry their own margins (a plugin's MargOHNM)."""

    def __init__(self, w: float = 1.0) -> None:
        self.w = w

    def __call__(self, embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return registry.build_miner("batch_hard")(embeddings, labels)


def test_a_registered_miner_is_planned_from_its_fields(installed, tmp_path):
    from bench.plan import plan

    registry.register(
        "miner",
        "reg_margins",
        tuples="triplets",
        supplies=("margin",),
        min_classes=3,
        search_space={"w": {"type": "float", "low": 0.5, "high": 2.0}},
    )(_MarginMiner)
    entry = registry.get("miner", "reg_margins")
    assert entry.plugin and entry.source == f"register() in {__name__}" and len(entry.source_hash) == 64
    proto = tmp_path / "p.yaml"
    proto.write_text(PROTOCOL.format(second="pml:NTXentLoss").replace("file_hardest", "reg_margins"))
    p = plan(load_protocol(proto))
    assert set(p.cell("plugin_triplet+reg_margins").search_space) == {"miner.w"}  # its tuples supply the margin
    assert set(p.cell("plugin_triplet+none").search_space) == {"loss.margin"}
    small = PROTOCOL.format(second="pml:NTXentLoss").replace("file_hardest", "reg_margins").replace("P: 5", "P: 2")
    proto.write_text(small)
    with pytest.raises(BenchError, match="reg_margins"):
        load_protocol(proto)  # min_classes 3: a batch of 2 classes is refused


def test_a_search_space_naming_a_parameter_the_class_lacks_is_refused_when_registered(tmp_path, capsys):
    """It used to be accepted, then fail every trial ("has no parameter ...") and leave the cell out of the table."""

    class Centroid(torch.nn.Module):
        def __init__(self, margin: float = 0.1) -> None:
            super().__init__()
            self.margin = margin

    with pytest.raises(
        BenchError,
        match=r"search_space names 'temperature', which .* does not take "
        r"\(its parameters: margin\)",
    ):
        registry.register(
            "loss",
            "centroid_bad_space",
            tuples="pairs",
            search_space={"temperature": {"type": "float", "low": 0.1, "high": 1.0}},
        )(Centroid)
    assert "centroid_bad_space" not in registry.names("loss")
    plugin = tmp_path / "bad_space.py"
    plugin.write_text(
        "import torch\nfrom bench.registry import register\n\n"
        "@register('loss', 'bad_space', tuples='pairs', search_space={'tau': {'type': 'float', 'low': 0.1, 'high': 1}})\n"
        "class BadSpace(torch.nn.Module):\n    def __init__(self, margin=0.1):\n        super().__init__()\n"
    )
    assert main(["--plugin", str(plugin), "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'tau'" in err and "does not take" in err


def test_every_built_in_search_space_names_parameters_its_method_takes():
    for entry in registry.ENTRIES:
        if entry.search_space:
            assert set(entry.search_space) <= set(entry.parameters()), entry.name


PLAIN_MODULE = '''
import torch


class CentroidLoss(torch.nn.Module):
    """Distance of each embedding to its class centroid (a plain class: no register)."""

    tuples = "proxy"

    def __init__(self, scale: float = 1.0, num_classes: int = 0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, embeddings, labels, indices_tuple=None):
        out = embeddings.sum() * 0.0
        for c in labels.unique():
            x = embeddings[labels == c]
            out = out + ((x - x.mean(0)) ** 2).sum()
        return self.scale * out


class NoTuplesLoss(torch.nn.Module):
    def __init__(self, margin: float = 0.1) -> None:
        super().__init__()


class EveryPairMiner:
    """Every pair of the batch (a plain class)."""

    tuples = "pairs"

    def __init__(self, limit: int = 10) -> None:
        self.limit = limit

    def __call__(self, embeddings, labels):
        from bench.tuples import all_pairs

        return all_pairs(labels)


class TinyTrunk(torch.nn.Module):
    """A flatten and a linear layer (a plain class)."""

    def __init__(self, in_shape, embedding_dim: int, bias: bool = True) -> None:
        super().__init__()
        import math

        self.fc = torch.nn.Linear(math.prod(in_shape), embedding_dim, bias=bias)

    def forward(self, x):
        return self.fc(x.flatten(1))
'''


@pytest.fixture
def plain_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A package whose entry points name its classes, with no `register` call, installed as pip would."""
    site = tmp_path / "site"
    (site / "plain_dml").mkdir(parents=True)
    (site / "plain_dml" / "__init__.py").write_text(PLAIN_MODULE)
    info = site / "plain_dml-2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plain-dml\nVersion: 2.0\n")
    (info / "entry_points.txt").write_text(
        "[dmlbench.losses]\ncentroid = plain_dml:CentroidLoss\nno_tuples = plain_dml:NoTuplesLoss\n"
        "[dmlbench.miners]\nevery_pair = plain_dml:EveryPairMiner\n"
        "[dmlbench.trunks]\ntiny = plain_dml:TinyTrunk\n"
    )
    monkeypatch.syspath_prepend(str(site))
    yield
    for key in [k for k, e in _lookup._REGISTERED.items() if e.plugin]:
        del _lookup._REGISTERED[key]
    sys.modules.pop("plain_dml", None)


def test_an_entry_point_naming_a_class_is_that_method_without_register(plain_installed, capsys):
    loss = registry.get("loss", "centroid")
    assert loss.tuples == "proxy" and loss.source == "entry point plain-dml" and loss.version == "2.0"
    assert loss.needs == ("num_classes",) and list(loss.parameters()) == ["scale"] and loss.search_space == {}
    assert len(loss.source_hash) == 64 and loss.plugin
    built = registry.build_loss("centroid", {"num_classes": 3}, scale=2.0)
    assert built.scale == 2.0
    miner = registry.get("miner", "every_pair")
    assert miner.tuples == "pairs" and registry.incompatibility(loss, miner) is not None  # a proxy loss
    trunk = registry.build_trunk("tiny", in_shape=(1, 4, 4), embedding_dim=3, bias=False)
    assert trunk(torch.zeros(2, 1, 4, 4)).shape == (2, 3)
    assert registry.get("trunk", "tiny").tuples == ""
    with pytest.raises(BenchError, match=r"add a class attribute tuples = \"pairs\" .* to NoTuplesLoss, or decorate"):
        registry.get("loss", "no_tuples")
    assert main(["train", "--loss", "no_tuples", "--iterations", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("dmlbench: error:") == 1 and 'tuples = "pairs"' in err and "Traceback" not in err


def test_a_protocol_names_entry_point_classes_without_register(plain_installed):
    from bench.protocol import parse_protocol
    from bench.protocol.hashing import plugin_fingerprints

    text = PROTOCOL.replace("trunk: mlp, trunk_params: {{hidden: [32]}}", "trunk: tiny").format(second="centroid")
    text = text.replace("plugin_triplet, miners: [none, file_hardest]", "centroid, label: c2, miners: [none]")
    text = text.replace("[{name: none}, {name: file_hardest}]", "[{name: none}, {name: every_pair}]")
    protocol = parse_protocol(text)
    assert set(protocol.doc["grid"]["losses"][0]["search_space"]) == set()
    assert {"loss:centroid", "trunk:tiny"} <= set(plugin_fingerprints(protocol.doc))  # in the hash, as register's


def test_a_loss_that_ignores_miners_declares_proxy_and_readme_says_so():
    """docs/plugins.md, "Your own loss, miner or trunk": tuples="proxy" for a loss that never reads
    indices_tuple; every miner is then dropped with a reason that fits any such loss, not only proxy losses."""
    ignores = registry.Entry("centroid_x", "loss", "x:Y", "", "", "proxy")
    why = registry.incompatibility(ignores, registry.get("miner", "batch_hard"))
    assert why is not None and "learns from labels alone" in why and "would be ignored" in why
    page = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
    section = page.split("## Your own loss, miner or trunk")[1].split("\n## ")[0]
    assert "loss that ignores miners" in section and 'declares `tuples="proxy"`' in section
