"""Whether two checkouts train alike: the same short runs with each one's code, their trained tensors compared.

A long run pins the commit every part runs (checkpoints/NAME/run.env); moving it to a later commit is sound
only where the later code trains every run bit for bit as the earlier did. This trains three short Conv-4
runs on Omniglot 28x28 (the converged protocol's kind: P=32, K=4, affine augmentation, fp32 + channels-last,
early stopping; triplet + hard, quadruplet with its learned metric + MargOHNM, lifted structure) with each
checkout's `bench` on this interpreter's packages, one thread, and compares a digest of every trained tensor.

    python3 scripts/same_numerics.py /work/conv-tree /work/main [--data-root DIR] [--iterations 60]

Exit: 0 the same bit for bit; 1 they differ (each run's digests printed); 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

RUNS = {
    "triplet+hard": {"loss": "triplet", "miner": "hard"},
    "quadruplet-learned-dp+margohnm-w1": {
        "loss": "quadruplet",
        "loss_params": {"learned_metric": True, "pair_input": "difference_product"},
        "miner": "margohnm",
        "miner_params": {"w2": 0.5},
    },
    "lifted_structure": {"loss": "lifted_structure"},
}


def digests(data_root: str | None, iterations: int = 60) -> dict[str, list]:
    """Train RUNS with the `bench` on sys.path; each run's iterations, best checkpoint, final loss, digest."""
    import hashlib

    import torch

    from bench.data import load
    from bench.training import EarlyStopping, TrainConfig, train

    torch.set_num_threads(1)
    data = load("omniglot:background", data_root, 28)
    data = data.subset(data.classes[:200])
    out = {}
    for name, methods in RUNS.items():
        config = TrainConfig(
            trunk="conv4",
            embedding_dim=64,
            P=32,
            K=4,
            iterations=iterations,
            seed=11,
            augmentation="affine",
            channels_last=True,
            schedule={"type": "constant", "warmup": min(50, iterations - 1)},
            **methods,
        )
        # a score read from the weights, so the best checkpoint depends on every step before it
        stopping = EarlyStopping(max(iterations // 3, 1), 2, lambda it, model: float(next(model.parameters()).sum()))
        result = train(config, data, early_stopping=stopping)
        digest = hashlib.sha256()
        for module in (result.model, result.loss_module):
            for key, value in module.state_dict().items():
                digest.update(key.encode())
                digest.update(value.detach().cpu().contiguous().numpy().tobytes())
        out[name] = [result.iterations, result.best_iteration, repr(result.final_loss), digest.hexdigest()]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, help="two checkouts of the project")
    parser.add_argument("--data-root", help="the folder holding omniglot/ (default: as dmlbench resolves it)")
    parser.add_argument("--iterations", type=int, default=60, help="each run's iterations (default 60)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)  # one tree's runs, as JSON
    args = parser.parse_args(argv)
    if args.iterations < 1:
        print(f"same_numerics: --iterations must be positive, got {args.iterations}", file=sys.stderr)
        return 2
    if args.inside:
        print(json.dumps(digests(args.data_root, args.iterations)))
        return 0
    results = []
    for tree in args.trees:
        if not (Path(tree) / "bench" / "__init__.py").is_file():
            print(f"same_numerics: {tree}: not a checkout of the project (no bench/__init__.py)", file=sys.stderr)
            return 2
        env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            *args.trees,
            "--inside",
            "--iterations",
            str(args.iterations),
        ]
        if args.data_root:
            command += ["--data-root", args.data_root]
        done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tree)
        if done.returncode != 0:
            print(f"same_numerics: {tree}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 2
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for name in RUNS:
        a, b = (r[name] for r in results)
        print(f"{name}: {'same' if a == b else 'DIFFERENT'} {a if a == b else (a, b)}")
    return 0 if results[0] == results[1] else 1


if __name__ == "__main__":
    sys.exit(main())
