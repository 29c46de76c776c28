"""What every own triplet miner shares (`bench.miners._common`): empty batches, no gradients, errors, the dense path."""

from __future__ import annotations

import pytest
import torch
from _triplet_refs import _pk

from bench.errors import BenchError
from bench.registry import build_loss, build_miner


def test_no_valid_triplet_gives_a_connected_zero():
    x = torch.randn(4, 3, requires_grad=True)
    for y in (torch.zeros(4, dtype=torch.long), torch.arange(4)):
        loss = build_loss("triplet")
        value = loss(x, y)
        value.backward()
        assert float(value.detach()) == 0.0 and loss.stats["num_tuples"] == 0
        assert torch.equal(x.grad, torch.zeros_like(x))
        for name in ("batch_all", "batch_hard", "semihard", "hard"):
            assert all(len(t) == 0 for t in build_miner(name)(x, y))


def test_miners_do_not_track_gradients():
    x = torch.randn(8, 4, requires_grad=True)
    y = torch.arange(4).repeat_interleave(2)
    for name in ("batch_all", "batch_hard", "semihard", "hard", "offline"):
        t = build_miner(name)(x, y)
        assert all(not i.requires_grad and i.dtype == torch.long for i in t)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: build_miner("batch_hard", foo=1), "no parameter 'foo'"),
        (lambda: build_miner("semihard", semantics="closest"), "semantics"),
        (lambda: build_miner("hard", distance="manhattan"), "distance"),
        (lambda: build_miner("offline", refresh_every=0), "refresh_every"),
        (lambda: build_miner("offline", strategy="easy"), "strategy"),
        (lambda: build_loss("triplet", reduction="max"), "reduction"),
        (lambda: build_loss("triplet", margin="big"), "margin"),
        (lambda: build_miner("no_such_miner"), "unknown miner"),
    ],
)
def test_bad_parameters_raise_bench_error(build, message):
    with pytest.raises(BenchError, match=message):
        build()


def test_bad_inputs_raise_bench_error():
    x = torch.randn(6, 3)
    with pytest.raises(BenchError, match="labels"):
        build_miner("batch_hard")(x, torch.zeros(6, 1, dtype=torch.long))
    with pytest.raises(BenchError, match="labels has 5"):
        build_miner("semihard")(x, torch.zeros(5, dtype=torch.long))
    with pytest.raises(BenchError, match="embeddings"):
        build_loss("triplet")(torch.randn(6), torch.zeros(6, dtype=torch.long))
    with pytest.raises(BenchError, match="outside the batch"):
        build_loss("triplet")(
            x, torch.zeros(6, dtype=torch.long), (torch.tensor([0]), torch.tensor([1]), torch.tensor([9]))
        )


@pytest.mark.parametrize("miner", ["batch_all", "semihard", "hard"])
def test_dense_path_equals_per_triplet_gather(miner):
    """Mined triplets carry their mask; a plain copy of the same indices must give the same loss."""
    x, y = _pk(6, 3, 5, 2)
    mined = build_miner(miner, **({} if miner == "hard" else {"margin": 0.3}))(x, y)
    loss = build_loss("triplet", margin=0.3)
    dense = loss(x, y, mined)
    stats = dict(loss.stats)
    plain = loss(x, y, tuple(t.clone() for t in mined))
    assert float(dense) == pytest.approx(float(plain), rel=1e-12)
    assert stats == loss.stats and stats["num_tuples"] == len(mined[0]) > 0
