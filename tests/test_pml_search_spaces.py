"""`pml:<Class>` methods search the Reality Check's space by default; a cell that searches nothing can run one trial.

The spaces are checked against protocols/reality-check-cub.yaml, whose ranges
hold every optimum the paper published (tests/test_reality_check.py), so the
two cannot drift apart; `tuning.unsearched` is checked on the plan and on the
shipped protocols' hashes (absent, it keeps what they ran).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from bench import registry
from bench.plan import plan
from bench.protocol import ProtocolError, load_protocol, parse_protocol

REPO = Path(__file__).resolve().parents[1]

# reality-check-cub.yaml's cell (loss name, or miner name) -> the PML class it runs, and the parameters the
# generic adapter cannot take (a loss's own learning rate, a regulariser's weight)
_CUB_CELLS = {
    ("loss", "contrastive"): ("ContrastiveLoss", ()),
    ("loss", "triplet"): ("TripletMarginLoss", ()),
    ("loss", "infonce"): ("NTXentLoss", ()),
    ("loss", "pml-proxy_nca"): ("ProxyNCALoss", ("lr",)),
    ("loss", "pml-margin"): ("MarginLoss", ("lr",)),
    ("loss", "pml-normalized_softmax"): ("NormalizedSoftmaxLoss", ("lr",)),
    ("loss", "pml-cosface"): ("CosFaceLoss", ("lr",)),
    ("loss", "pml-arcface"): ("ArcFaceLoss", ("lr",)),
    ("loss", "pml-fast_ap"): ("FastAPLoss", ()),
    ("loss", "pml-snr_contrastive"): ("SignalToNoiseRatioContrastiveLoss", ("regularizer_weight",)),
    ("loss", "pml-multi_similarity"): ("MultiSimilarityLoss", ()),
    ("loss", "pml-soft_triple"): ("SoftTripleLoss", ("reg_weight", "lr")),
    ("miner", "pml-multi_similarity"): ("MultiSimilarityMiner", ()),
}


def _cub_spaces() -> dict[tuple[str, str], dict]:
    doc = load_protocol(REPO / "protocols" / "reality-check-cub.yaml").doc
    out = {}
    for kind, section in (("loss", "losses"), ("miner", "miners")):
        for item in doc["grid"][section]:
            out.setdefault((kind, item["label"]), item["search_space"])
    return out


def test_every_reality_check_pml_class_searches_the_papers_space() -> None:
    cub = _cub_spaces()
    assert len(registry.PML_SEARCH_SPACES) == len(_CUB_CELLS)
    for (kind, label), (cls, left_out) in _CUB_CELLS.items():
        paper = {k: v for k, v in cub[(kind, label)].items() if k not in left_out}
        entry = registry.get(kind, f"pml:{cls}")
        assert entry.search_space == paper, cls
        # every searched name is a parameter the adapter takes (a typo would fail every trial of every sweep)
        taken = inspect.signature(entry.resolve()).parameters
        assert set(entry.search_space) <= set(taken), cls


def test_a_pml_cell_without_a_search_space_tunes_its_default(tmp_path: Path) -> None:
    text = _protocol(
        "    - {name: 'pml:NTXentLoss'}\n"
        "    - {name: 'pml:TripletMarginLoss', label: tml-fixed, params: {margin: 0.1}}\n"
        "    - {name: 'pml:CircleLoss'}\n"
    )
    p = plan(parse_protocol(text, base=tmp_path))
    spaces = {c.id: c.search_space for c in p.cells}
    assert spaces["pml-NTXentLoss+none"] == {"loss.temperature": registry.float_space(1e-4, 1.0, log=True)}
    assert spaces["tml-fixed+none"] == {}  # a fixed parameter is not searched
    # the Reality Check did not tune it: the space of the built-in entry that wraps it
    assert spaces["pml-CircleLoss+none"] == {
        f"loss.{k}": v for k, v in registry.get("loss", "pml:circle").search_space.items()
    }
    assert spaces["pml-CircleLoss+none"]
    # a protocol's own range replaces the default, key by key
    own = parse_protocol(
        _protocol("    - {name: 'pml:NTXentLoss', search_space: {temperature: {type: float, low: 0.05, high: 0.2}}}\n"),
        base=tmp_path,
    )
    assert own.doc["grid"]["losses"][0]["search_space"]["temperature"]["low"] == 0.05


def test_one_trial_for_a_cell_that_searches_nothing(tmp_path: Path) -> None:
    losses = "    - {name: triplet}\n    - {name: triplet, label: fixed, search_space: {margin: null}}\n"
    every = plan(parse_protocol(_protocol(losses), base=tmp_path))
    one = plan(parse_protocol(_protocol(losses, unsearched="one"), base=tmp_path))
    trials = {c.id: one.budget.trials_for(c) for c in one.cells}
    assert trials == {"triplet+none": 3, "fixed+none": 1}
    assert {c.id: every.budget.trials_for(c) for c in every.cells} == {"triplet+none": 3, "fixed+none": 3}
    # the estimate and the total count one trial's runs for it
    assert one.total_iterations == every.total_iterations - 2 * 10
    assert one.estimates["fixed+none"].mid_s < every.estimates["fixed+none"].mid_s
    # writing the default out is the protocol without it; "one" is another protocol
    assert parse_protocol(_protocol(losses, unsearched="all")).hash == parse_protocol(_protocol(losses)).hash
    assert parse_protocol(_protocol(losses, unsearched="one")).hash != parse_protocol(_protocol(losses)).hash
    with pytest.raises(ProtocolError, match="unsearched"):
        parse_protocol(_protocol(losses, unsearched="none"))


def test_plan_says_which_cells_search_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.cli import main

    losses = "    - {name: triplet}\n    - {name: triplet, label: fixed, search_space: {margin: null}}\n"
    for unsearched, said in (
        ("all", "searching nothing: fixed+none: their 3 trials each differ by seed alone"),
        ("one", "searching nothing, one tuning trial each (tuning.unsearched: one): fixed+none"),
    ):
        path = tmp_path / f"{unsearched}.yaml"
        path.write_text(_protocol(losses, unsearched=unsearched))
        assert main(["plan", str(path)]) == 0
        out = capsys.readouterr().out
        assert said in out
        row = next(line for line in out.splitlines() if line.strip().startswith("fixed+none "))
        assert row.split()[1] == ("1" if unsearched == "one" else "3")


def test_shipped_protocols_keep_their_trials_and_hashes() -> None:
    """Absent, tuning.unsearched is "all": the shipped protocols with a cell that searches nothing (their
    committed results ran tuning.trials trials for it) plan what they ran, under the hash they had."""
    quick = load_protocol(REPO / "protocols" / "omniglot-quick.yaml")
    assert quick.hash12 == "4b7f40195b11"
    p = plan(quick)
    fixed = p.cell("triplet-fixed+hard")
    assert not fixed.search_space and p.budget.trials_for(fixed) == quick.doc["tuning"]["trials"] == 4


def _protocol(losses: str, unsearched: str | None = None) -> str:
    tuning = "{trials: 3" + (f", unsearched: {unsearched}" if unsearched else "") + "}"
    return f"""
name: tiny
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 12
  test_classes: 8
  image_size: 14
  validation: {{folds: 3, use: 1}}
model: {{trunk: mlp, trunk_params: {{hidden: [16]}}, embedding_dim: 8, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 4, K: 4, iterations: 10}}
evaluation: {{metrics: [map_at_r], primary: map_at_r}}
tuning: {tuning}
final: {{seeds: 2}}
grid:
  losses:
{losses}"""


@pytest.mark.parametrize("key", sorted(registry.PML_SEARCH_SPACES), ids=lambda k: k[1])
def test_each_default_space_builds_and_runs_at_its_ends(key: tuple[str, str]) -> None:
    """Every end of every default range builds the PML class and gives a finite loss (or tuples) on a batch."""
    import torch

    kind, cls = key
    entry = registry.get(kind, f"pml:{cls}")
    context = {"num_classes": 4, "embedding_size": 8}
    torch.manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(16, 8), dim=1).requires_grad_()
    y = torch.arange(4).repeat_interleave(4)
    for end in ("low", "high"):
        params = {k: d[end] for k, d in entry.search_space.items()}
        if kind == "miner":
            tuples = registry.build_miner(entry.name, context, **params)(x.detach(), y)
            assert len(tuples) == 4
            continue
        loss = registry.build_loss(entry.name, context, **params)
        value = loss(x, y)
        assert torch.isfinite(value), (cls, end, params)
        value.backward()
