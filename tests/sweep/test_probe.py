"""The dead-parameter probe: a searched parameter that changes nothing training sees is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.cli import main
from bench.errors import BenchError
from bench.plan import plan
from bench.protocol import parse_protocol
from bench.sweep.probe import check_live, dead_cells, dead_parameters, probe_batches, same_direction

BASE = """\
name: probe
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 12
  test_classes: 6
  image_size: 28
  validation: {folds: 3, use: 1}
model: {trunk: conv4, embedding_dim: 16, normalize: true}
training: {optimizer: adam, lr: 1.0e-3, P: 6, K: 4, iterations: 10}
evaluation: {metrics: [map_at_r], primary: map_at_r}
tuning: {trials: 2}
final: {seeds: 1}
grid:
  losses:
"""

# A loss and miner whose every searched parameter moves the gradient (proxies included: seeded alike).
LIVE = (
    BASE
    + """\
    - {name: triplet, miners: [batch_all, semihard]}
    - {name: infonce, miners: [none]}
    - {name: "pml:proxy_anchor", miners: [none]}
  miners: [{name: none}, {name: batch_all}, {name: semihard}]
"""
)

# offline's chunk_size only splits the work: its two ends give the same triplets and the same gradient
# whatever the loss and miner become, so it is dead by construction.
DEAD = (
    BASE
    + """\
    - {name: triplet, miners: [offline]}
  miners:
    - name: offline
      params: {triplets_per_batch: 4}
      search_space: {chunk_size: {type: int, low: 4, high: 64}}
"""
)


def test_live_parameters_pass() -> None:
    p = plan(parse_protocol(LIVE, "live.yaml"))
    assert {c.id for c in p.cells} == {"triplet+batch_all", "triplet+semihard", "infonce+none", "pml-proxy_anchor+none"}
    assert dead_parameters(p) == []
    check_live(p)


def test_a_dead_parameter_is_refused_by_name() -> None:
    p = plan(parse_protocol(DEAD, "dead.yaml"))
    dead = dead_parameters(p)
    assert [(d.cell, d.parameter) for d in dead] == [("triplet+offline", "miner.chunk_size")]
    assert (dead[0].low, dead[0].high) == (4, 64)
    with pytest.raises(BenchError, match=r"dead search parameters: triplet\+offline miner.chunk_size \[4, 64\]: ") as e:
        check_live(p)
    assert "loss.margin" not in str(e.value)  # the live margin of the same cell is not named


def test_validate_refuses_a_dead_search_parameter(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    live, dead = tmp_path / "live.yaml", tmp_path / "dead.yaml"
    live.write_text(LIVE)
    dead.write_text(DEAD)
    assert main(["validate", str(live)]) == 0
    # the live file may draw the timed precision warning (its fixed precision against this machine's fastest)
    assert all("training.precision:" in line for line in capsys.readouterr().err.splitlines())
    assert main(["validate", str(dead)]) == 2
    err = capsys.readouterr().err
    assert "dead search parameters: triplet+offline miner.chunk_size [4, 64]" in err and err.count("\n") == 1


# on the unit sphere every distance is at most 2: a positive margin of 2 and a negative margin of 0 leave no
# pair inside either hinge, so the loss is 0 on every batch and the trunk never moves
SILENT = (
    BASE
    + """\
    - {name: triplet, miners: [batch_all]}
    - name: contrastive
      label: contrastive-silent
      params: {pos_margin: 2.0, neg_margin: 0.0}
      search_space: {pos_margin: null, neg_margin: null}
      miners: [none]
  miners: [{name: none}, {name: batch_all}]
"""
)


def test_a_cell_whose_loss_gives_no_gradient_is_refused_by_name(tmp_path: Path, capsys) -> None:
    p = plan(parse_protocol(SILENT, "silent.yaml"))
    assert dead_parameters(p) == [] and dead_cells(p) == ["contrastive-silent+none"]
    with pytest.raises(BenchError, match=r"cells that train nothing: contrastive-silent\+none: the loss gives a zero"):
        check_live(p)
    live = plan(parse_protocol(SILENT.replace("pos_margin: 2.0", "pos_margin: 0.5"), "live.yaml"))
    assert dead_cells(live) == []  # positives farther than 0.5 apart pull: the same cell trains
    path = tmp_path / "silent.yaml"
    path.write_text(SILENT)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cells that train nothing: contrastive-silent+none" in err and err.count("\n") == 1


def test_same_direction_is_up_to_a_positive_factor() -> None:
    g = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    assert same_direction(g, 3.5 * g)
    assert not same_direction(g, -g)
    assert not same_direction(g, g + 0.1 * torch.randn(8, 4, generator=torch.Generator().manual_seed(1)))
    zero = torch.zeros_like(g)
    assert same_direction(zero, zero) and not same_direction(zero, g)


def test_probe_batches_are_seeded_on_the_sphere_and_clustered_last() -> None:
    a, b = probe_batches(5, 3, 8, normalize=True), probe_batches(5, 3, 8, normalize=True)
    assert len(a) == 4 and all(torch.equal(x, y) for (x, _), (y, _) in zip(a, b))
    for x, labels in a:
        assert x.shape == (15, 8) and labels.tolist() == [c for c in range(5) for _ in range(3)]
        assert torch.allclose(x.norm(dim=1), torch.ones(15))
    x, labels = a[-1]
    d = torch.cdist(x, x)
    same = labels[:, None] == labels[None, :]
    assert d[same].mean() < 0.5 * d[~same].mean()  # the last batch looks partly trained
