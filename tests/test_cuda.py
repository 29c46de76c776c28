"""The CUDA path: own losses, miners, metrics, a training run and a sweep on a GPU equal or match the CPU.

CI has no GPU, so these skip there; they are run on a GPU machine when one
is lent (benchmarks/README.md, "On a GPU"). A device bug (a tensor built on the CPU
inside a loss, an index on the wrong device, a metric that moves data back
and forth) shows up here as an error or as a CPU/GPU difference.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from bench.registry import build_loss, build_miner
from bench.tuples import ViolatingQuadruplets

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# (loss, loss params, miner or None, miner params): every own loss, each triplet miner, MargOHNM
CASES = [
    ("contrastive", {}, None, {}),
    ("contrastive", {"distance": "squared_euclidean"}, "batch_all", {}),
    ("triplet", {"margin": 0.2}, None, {}),
    ("triplet", {"margin": 0.2}, "batch_all", {"margin": 0.2}),
    ("triplet", {"margin": 0.2}, "batch_hard", {}),
    ("triplet", {"margin": 0.2}, "semihard", {"margin": 0.2}),
    ("triplet", {"margin": 0.2}, "hard", {}),
    ("quadruplet", {}, None, {}),
    ("quadruplet", {}, "margohnm", {}),
    ("quadruplet", {"learned_metric": True}, "margohnm", {}),
    ("quadruplet", {}, "margohnm", {"max_tuples": 10**9}),  # listed: every violating quadruplet enumerated
    ("lifted_structure", {}, None, {}),
    ("npair", {}, None, {}),
    ("infonce", {}, None, {}),
]


def _batch(P: int = 16, K: int = 4, dim: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(P * K, dim, generator=g, dtype=torch.float64), torch.arange(P).repeat_interleave(K)


def _value_and_grad(loss, miner, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    e = x.clone().requires_grad_(True)
    tuples = miner(e, y) if miner is not None else None
    value = loss(e, y, tuples)
    value.backward()
    if isinstance(tuples, ViolatingQuadruplets):  # unlisted: how many violate is what there is to compare
        return value.detach().cpu(), e.grad.cpu(), (torch.tensor([tuples.count]),)
    return value.detach().cpu(), e.grad.cpu(), tuple(t.cpu() for t in tuples[:4]) if tuples is not None else ()


@pytest.mark.parametrize(
    "loss_name,loss_params,miner_name,miner_params",
    CASES,
    ids=[
        f"{c[0]}{'-learned' if c[1].get('learned_metric') else ''}+{c[2]}{'-listed' if 'max_tuples' in c[3] else ''}"
        for c in CASES
    ],
)
def test_losses_and_miners_give_the_cpu_values_on_cuda(loss_name, loss_params, miner_name, miner_params) -> None:
    x, y = _batch()
    loss_cpu = build_loss(loss_name, **loss_params).double()
    miner_cpu = build_miner(miner_name, **miner_params) if miner_name else None
    if miner_cpu is not None and hasattr(miner_cpu, "bind_loss"):
        miner_cpu.bind_loss(loss_cpu)
    cpu = _value_and_grad(loss_cpu, miner_cpu, x, y)  # also materialises a learned metric's lazy layer
    loss_gpu = copy.deepcopy(loss_cpu).cuda()
    miner_gpu = build_miner(miner_name, **miner_params) if miner_name else None
    if miner_gpu is not None and hasattr(miner_gpu, "bind_loss"):
        miner_gpu.bind_loss(loss_gpu)
    gpu = _value_and_grad(loss_gpu, miner_gpu, x.cuda(), y.cuda())
    assert float(cpu[0]) != 0.0 or loss_name == "quadruplet"
    torch.testing.assert_close(gpu[0], cpu[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gpu[1], cpu[1], rtol=1e-7, atol=1e-10)
    for a, b in zip(gpu[2], cpu[2]):  # the same tuples, in the same order
        assert torch.equal(a, b)


def test_retrieval_metrics_on_cuda_equal_cpu() -> None:
    from bench.metrics import retrieval_metrics

    g = torch.Generator().manual_seed(1)
    labels = torch.arange(300).repeat_interleave(7)
    emb = torch.randn(len(labels), 64, generator=g) + 0.8 * torch.randn(300, 64, generator=g)[labels]
    cpu = retrieval_metrics(emb, labels)
    gpu = retrieval_metrics(emb.cuda(), labels.cuda())
    assert cpu.keys() == gpu.keys() and 0.05 < cpu["map_at_r"] < 0.95
    for k in cpu:
        assert gpu[k] == pytest.approx(cpu[k], abs=1e-6), k


def test_training_runs_on_cuda_learn(data_root: Path) -> None:
    """Conv-4 on 40 Omniglot classes: parameters (a learned metric's too) live on the GPU, and a
    triplet run beats the untrained trunk."""
    from bench.data import load
    from bench.evaluation import evaluate
    from bench.registry import build_trunk
    from bench.training import TrainConfig, train

    background = load("omniglot:background", data_root, 28)
    evaluation = load("omniglot:evaluation", data_root, 28)
    train_data, test_data = background.subset(background.classes[:40]), evaluation.subset(evaluation.classes[:40])
    base = dict(trunk="conv4", embedding_dim=64, P=16, K=4, iterations=150, seed=0, device="cuda")
    torch.manual_seed(0)
    untrained = build_trunk("conv4", in_shape=(1, 28, 28), embedding_dim=64).cuda()
    before = evaluate(untrained, test_data, clustering=False, device="cuda")
    result = train(TrainConfig(loss="triplet", loss_params={"margin": 0.2}, miner="batch_hard", **base), train_data)
    assert result.status == "ok" and result.iterations == 150
    assert all(p.is_cuda for p in result.model.parameters())
    after = evaluate(result.model, test_data, clustering=False, device="cuda")
    assert after["map_at_r"] > before["map_at_r"] + 0.02, (before, after)

    learned = train(
        TrainConfig(loss="quadruplet", loss_params={"learned_metric": True}, miner="margohnm", **base), train_data
    )
    params = list(learned.loss_module.parameters())
    assert learned.status == "ok" and params and all(p.is_cuda for p in params)
    assert torch.isfinite(torch.tensor(learned.final_loss))


@pytest.mark.parametrize(
    "loss_name,miner_name,miner_params",
    [
        ("quadruplet", "hardest_of_pool", {"kind": "quadruplet", "pool_size": 64, "num_hardest": 4, "num_random": 4}),
        ("triplet", "hardest_of_pool", {"kind": "triplet", "pool_size": 64, "num_hardest": 8, "num_random": 8}),
        ("triplet", "offline", {}),
    ],
)
def test_dataset_level_miners_train_on_cuda(data_root: Path, loss_name: str, miner_name: str, miner_params) -> None:
    """The miners that pick a step's samples from the whole training split (their tuples index the batch's
    embeddings on the GPU): a quadruplet loss with hardest-of-pool failed on CPU positions there."""
    from bench.data import load
    from bench.training import TrainConfig, train

    background = load("omniglot:background", data_root, 28)
    train_data = background.subset(background.classes[:20])
    config = TrainConfig(
        loss=loss_name,
        miner=miner_name,
        miner_params=miner_params,
        trunk="conv4",
        embedding_dim=32,
        P=8,
        K=4,
        iterations=20,
        seed=0,
        device="cuda",
    )
    result = train(config, train_data)
    assert result.status == "ok" and result.iterations == 20, result
    assert torch.isfinite(torch.tensor(result.final_loss))


SWEEP = """
name: cuda-tiny
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 24
  test_classes: 12
  image_size: 28
  validation: {folds: 3, use: 1}
model: {trunk: conv4, embedding_dim: 32, normalize: true}
training: {optimizer: adam, lr: 1.0e-3, P: 8, K: 4, iterations: 40, device: cuda}
evaluation: {metrics: [precision_at_1, map_at_r], primary: map_at_r, ks: [1]}
tuning: {trials: 2, startup_trials: 1}
final: {seeds: 2}
grid:
  losses:
    - {name: triplet, miners: [batch_hard]}
    - {name: quadruplet, miners: [margohnm]}
  miners: [{name: batch_hard}, {name: margohnm}]
"""


def test_sweep_on_cuda_completes_every_cell(tmp_path: Path, data_root: Path) -> None:
    """`dmlbench run` with `training.device: cuda`: real Optuna and MLflow stores, both cells reported."""
    import pandas as pd

    from bench.cli import main

    proto = tmp_path / "cuda-tiny.yaml"
    proto.write_text(SWEEP)
    code = main(
        [
            "run",
            str(proto),
            "--results-dir",
            str(tmp_path / "results"),
            "--data-root",
            str(data_root),
            "--storage",
            f"sqlite:///{tmp_path / 'optuna.db'}",
            "--tracking-uri",
            str(tmp_path / "mlflow.db"),
            "--quiet",
        ]
    )
    assert code == 0
    summary = pd.read_csv(tmp_path / "results" / "cuda-tiny" / "summary.csv")
    assert sorted(summary["cell"]) == ["quadruplet+margohnm", "triplet+batch_hard"]
    assert (summary["n_seeds"] == 2).all() and summary["map_at_r_mean"].between(0.0, 1.0).all()


# --------------------------------------------------------------------------- the step at the GPU's pace


class SyncFreePairs(torch.nn.Module):
    """Every pair of the batch at once (cosine similarity, positives pulled to 1, negatives pushed under
    0.5): no index selection and no statistic read back, so the loop's own waits are all that is left."""

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: object = None) -> torch.Tensor:
        e = torch.nn.functional.normalize(embeddings, dim=1)
        sim = e @ e.T
        same = (labels[:, None] == labels[None, :]).float()
        pos_mask = same - torch.eye(len(labels), device=e.device)
        pos = ((1 - sim) * pos_mask).sum() / pos_mask.sum().clamp(min=1)
        neg = (torch.relu(sim - 0.5) * (1 - same)).sum() / (1 - same).sum().clamp(min=1)
        return pos + neg


@pytest.fixture
def sync_free_loss():
    from bench import registry
    from bench.registry import _lookup

    registry.register("loss", "sync_free_pairs", tuples="pairs")(SyncFreePairs)
    yield "sync_free_pairs"
    _lookup._REGISTERED.pop(("loss", "sync_free_pairs"), None)


@pytest.mark.parametrize("precision,optimizer", [("fp32", "adam"), ("bf16", "sgd")])
def test_the_training_loop_waits_for_the_gpu_only_at_its_read_backs(
    data_root: Path, sync_free_loss: str, precision: str, optimizer: str
) -> None:
    """Between read-backs (every SYNC_EVERY steps, checkpoints, the end) nothing in a step makes the host
    wait: CUDA's sync debug mode "error" raises at the first wait, from the first step on."""
    from bench.data import load
    from bench.data.samplers import CHUNK
    from bench.training import SYNC_EVERY, TrainConfig, train

    background = load("omniglot:background", data_root, 28)
    data = background.subset(background.classes[:40])
    config = TrainConfig(
        trunk="conv4",
        embedding_dim=64,
        loss=sync_free_loss,
        P=16,
        K=4,
        iterations=CHUNK + 2 * SYNC_EVERY + 5,  # past a chunk of batches and several read-backs
        seed=0,
        device="cuda",
        precision=precision,
        optimizer=optimizer,
        augmentation="shift",
        schedule={"type": "cosine", "warmup": 5},
    )
    seen: list[int] = []
    try:
        result = train(
            config,
            data,
            on_built=lambda trunk, loss: torch.cuda.set_sync_debug_mode("error"),
            progress=lambda it, total, loss: seen.append(it),
        )
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert result.iterations == config.iterations and seen[0] == SYNC_EVERY and seen[-1] == config.iterations
    assert torch.isfinite(torch.tensor(result.final_loss))


def test_batches_on_the_gpu_are_the_cpus() -> None:
    from bench.data.samplers import CHUNK, PKSampler

    sampler = PKSampler(torch.arange(30).repeat_interleave(7), 8, 4, seed=3)
    stream = sampler.iterate_on(torch.device("cuda"), 7)
    for step in range(7, 7 + 2 * CHUNK):
        got = next(stream)
        assert got.is_cuda and torch.equal(got.cpu(), sampler.batch(step)), step


def test_adam_and_sgd_are_fused_on_cuda() -> None:
    from bench.cell import build_cell as build
    from bench.cell import optimizer as _optimizer
    from bench.training import TrainConfig

    for name in ("adam", "sgd"):
        config = TrainConfig(trunk="mlp", embedding_dim=8, optimizer=name, device="cuda")
        trunk, loss, _ = build(config, (1, 8, 8), 4, torch.device("cuda"))
        assert _optimizer(config, trunk, loss).defaults["fused"] is True, name
