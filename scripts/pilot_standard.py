"""Pilot runs that sized omniglot-standard: one cell's training at several budgets, scored on the test classes.

Trains with bench's own loop (`bench.training.train`, the loop every trial and
final seed uses) on all 964 background characters and scores the 659
evaluation characters as a final seed is scored (L2-normalised retrieval
metrics and Lake's 20 one-shot runs, no clustering). One CSV line a run:
the Lake accuracy and MAP@R at each budget tell where the gain flattens, and
the training time per step (one thread; CPU time as well as wall time, since
the machine is shared) sizes the protocol. Pilots look
at test classes, so they choose a budget only, never a method's parameters.

    .venv/bin/python scripts/pilot_standard.py --loss triplet --miner batch_hard \\
        --iterations 1000 2000 3000 --P 32 --K 4 --augmentation affine --schedule cosine --warmup 0.05
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.commands.train import parse_params
from bench.data import load, load_lake_runs
from bench.evaluation import evaluate
from bench.training import TrainConfig, train


def main() -> None:
    """Parse the options and print one CSV line a budget."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loss", default="triplet")
    parser.add_argument("--loss-param", nargs="*", default=[], metavar="NAME=VALUE")
    parser.add_argument("--miner", default=None)
    parser.add_argument("--iterations", type=int, nargs="+", default=[1000, 2000, 3000])
    parser.add_argument("--P", type=int, default=32)
    parser.add_argument("--K", type=int, default=4)
    parser.add_argument("--embedding-dim", type=int, default=64)
    parser.add_argument("--augmentation", default=None, choices=["shift", "affine"])
    parser.add_argument("--schedule", default="constant", choices=["constant", "cosine", "step"])
    parser.add_argument("--milestones", type=float, nargs="*", default=[0.8], help="step: fractions of the budget")
    parser.add_argument("--gamma", type=float, default=0.1, help="step: the factor at each milestone")
    parser.add_argument("--warmup", type=float, default=0.0, help="warm-up as a fraction of the iterations")
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    background, evaluation = load("omniglot:background"), load("omniglot:evaluation")
    runs = load_lake_runs()
    print(
        "iterations,method,batch,augmentation,schedule,lake_accuracy,map_at_r,precision_at_1,train_s,ms_per_step,"
        "cpu_ms_per_step,eval_s"
    )
    for iterations in args.iterations:
        config = TrainConfig(
            trunk="conv4",
            embedding_dim=args.embedding_dim,
            loss=args.loss,
            loss_params=parse_params(tuple(args.loss_param), "--loss-param"),
            miner=args.miner,
            P=args.P,
            K=args.K,
            iterations=iterations,
            seed=args.seed,
            augmentation=args.augmentation,
            precision=args.precision,
            schedule={
                "type": args.schedule,
                "warmup": round(args.warmup * iterations),
                **({"milestones": args.milestones, "gamma": args.gamma} if args.schedule == "step" else {}),
            },
        )
        cpu = time.process_time()  # one thread: the step's cost even while other processes share the cores
        result = train(config, background)
        cpu = time.process_time() - cpu
        start = time.perf_counter()
        m = evaluate(result.model, evaluation, lake_runs=runs, clustering=False, normalize=True)
        eval_s = time.perf_counter() - start
        method = f"{args.loss}+{args.miner or 'none'}"
        print(
            f"{iterations},{method},{args.P}x{args.K},{args.augmentation},{args.schedule},"
            f"{m['lake_accuracy']:.4f},{m['map_at_r']:.4f},{m['precision_at_1']:.4f},{result.wall_time_s:.1f},"
            f"{1000 * result.wall_time_s / iterations:.1f},"
            f"{1000 * cpu / iterations:.1f},{eval_s:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
