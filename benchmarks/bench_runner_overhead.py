"""Harness overhead: one training run through the runner vs a bare PyTorch loop doing the same work.

Through the runner (`Sweep._final`, what every final seed goes through): a
slot claimed in the Optuna storage, a heartbeat thread, an MLflow run found
or created and logged, `bench.training.train` with the progress callback,
evaluation on the test classes, the result told to Optuna. The bare loop:
the same trunk, loss, data, PK batches, optimiser and iterations written
out by hand, then the same evaluation call. Both run in this process,
alternated (so drifting machine load hits both alike); the medians are
compared. Goal: ratio <= 1.05.

    .venv/bin/python benchmarks/bench_runner_overhead.py [--iterations 300] [--repeats 5]

(benchmarks/bench_overhead.py measures the training loop alone against a bare loop.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROTOCOL = """\
name: overhead
data:
  train: omniglot:background
  test: omniglot:evaluation
  train_classes: 40
  test_classes: 20
  image_size: 28
  validation: {{folds: 4, use: 1}}
model: {{trunk: conv4, embedding_dim: 64, normalize: true}}
training: {{optimizer: adam, lr: 1.0e-3, P: 8, K: 4, iterations: {iterations}}}
evaluation: {{metrics: [precision_at_1, map_at_r], primary: map_at_r, ks: [1]}}
tuning: {{trials: 1}}
final: {{seeds: {seeds}}}
grid:
  losses: [{{name: triplet, params: {{margin: 0.1}}, search_space: {{margin: null}}}}]
  miners: [{{name: batch_hard}}]
"""


def bare_run(protocol, prepared, cell, seed: int) -> float:
    """The same training and evaluation, with nothing of the harness around it."""
    from bench import registry
    from bench.data.samplers import PKSampler
    from bench.evaluation import evaluate

    t = protocol.spec.training
    start = time.perf_counter()
    torch.manual_seed(seed)
    data = prepared.train
    _, labels = torch.unique(data.y, return_inverse=True)
    model = registry.build_trunk("conv4", in_shape=tuple(data.x.shape[1:]), embedding_dim=64)
    loss_fn = registry.build_loss(cell.loss, **cell.loss_params)
    miner = registry.build_miner(cell.miner, **cell.miner_params)
    optimizer = torch.optim.Adam(model.parameters(), lr=t.lr)
    batches = iter(PKSampler(labels, t.P, t.K, seed))
    model.train()
    for _ in range(t.iterations):
        idx = torch.as_tensor(next(batches), dtype=torch.long)
        emb = model(data.x[idx])
        loss = loss_fn(emb, labels[idx], miner(emb, labels[idx]))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    evaluate(model, prepared.test, ks=(1,), clustering=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-root", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)

    import optuna

    from bench.protocol import parse_protocol
    from bench.sweep.runner import Sweep
    from bench.sweep.worker import Options

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        protocol = parse_protocol(PROTOCOL.format(iterations=args.iterations, seeds=args.repeats + 2), "overhead")
        sweep = Sweep(
            protocol,
            Options(
                storage=f"sqlite:///{root / 'optuna.db'}",
                tracking_uri=str(root / "mlruns"),
                results_dir=root / "results",
                data_root=args.data_root,
                quiet=True,
            ),
        )
        sweep.setup()
        from bench.sweep.progress import Progress

        sweep.progress = Progress(1, 0, quiet=True, stream=open("/dev/null", "w"))
        cell = sweep.plan.cells[0]
        best = optuna.trial.create_trial(params={}, distributions={}, value=0.0, user_attrs={"slot": 0})
        finals = sweep.finals[cell.id][0]  # tuning draw 0's final seeds

        def runner_run() -> float:
            slot = finals.claim()
            start = time.perf_counter()
            sweep._final(cell, finals, slot, best, 0, slot.slot)
            return time.perf_counter() - start

        finals.claim()  # slot 0 also writes report artifacts: leave it out of the comparison
        bare_run(protocol, sweep.prepared, cell, 0)  # warm-up: first-call costs (imports, allocator)
        runner_run()
        bare, harness = [], []
        for i in range(args.repeats):
            bare.append(bare_run(protocol, sweep.prepared, cell, i))
            harness.append(runner_run())
            print(f"repeat {i + 1}: bare {bare[-1]:.2f} s, runner {harness[-1]:.2f} s", flush=True)
    b, h = statistics.median(bare), statistics.median(harness)
    ratio = h / b
    print(
        f"{args.iterations} iterations of conv4 28x28 batch 32 (triplet + batch_hard) and evaluation "
        f"on 20 test classes: bare median {b:.2f} s, runner median {h:.2f} s, ratio {ratio:.3f} (goal <= 1.05)"
    )
    return 0 if ratio <= 1.05 else 1


if __name__ == "__main__":
    sys.exit(main())
