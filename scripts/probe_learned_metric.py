"""Does the learned-metric quadruplet cell train? Each form ranked by its own g, beside its own floor.

Trains Conv-4 with the quadruplet loss and MargOHNM on Omniglot background
classes: Euclidean, and with Chen et al.'s learned metric fed the pair as
the paper does (``pair_input: concat``) and as Koch et al.'s Siamese network
does (``difference_product``). Each is scored on evaluation classes by the
protocols' own call (`bench.evaluation.evaluate`): a learned-metric run is
ranked by ``g`` (chunked query x reference matrix), its embedding-distance
ranking beside it (``embedding_``), and its floor is its untrained trunk with
its untrained metric, built as training builds them for the seed, scored the
same way. Also scores training classes the runs saw.

    .venv/bin/python scripts/probe_learned_metric.py [--iterations 300] [--train-classes 200]
        [--test-classes 100] [--runs concat difference_product] [--trace 25]

``--trace N`` prints MargOHNM's batch statistics every N mining calls
(``mu_p``, ``mu_n``: mean ``G`` over positive / negative pairs; the margins;
how many quadruplets violate; their mean loss), which shows whether the
loss falls by ordering pairs or by shrinking the metric's whole scale.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from bench.data import load
from bench.evaluation import evaluate, pair_scorer_of
from bench.miners.margohnm import MargOHNMMiner
from bench.training import TrainConfig, build, seed_everything, train

RUNS = {  # name: (loss params, miner)
    "euclidean": ({}, "margohnm"),
    "concat": ({"learned_metric": True}, "margohnm"),
    "difference_product": ({"learned_metric": True, "pair_input": "difference_product"}, "margohnm"),
}


def floor(config: TrainConfig, train_data, data) -> dict[str, float]:
    """The run's untrained trunk and metric (training's own seeding and build), scored as the run is."""
    seed_everything(config.seed)
    classes = len(torch.unique(train_data.y))
    trunk, loss, _ = build(config, tuple(train_data.x.shape[1:]), classes, torch.device(config.device))
    return evaluate(trunk.eval(), data, clustering=False, normalize=True, metric=pair_scorer_of(loss))


def trace_margohnm(every: int) -> None:
    """Print MargOHNM's stats every ``every`` calls (a probe: wraps the class's ``mine`` in place)."""
    mine = MargOHNMMiner.mine

    def traced(self: MargOHNMMiner, embeddings: torch.Tensor, labels: torch.Tensor):
        out = mine(self, embeddings, labels)
        if self._calls % every == 0:
            s = self.stats
            print(
                f"  call {self._calls:4d} warmup={int(s['warmup'])} mu_p={s.get('mu_p', math.nan):.3f} "
                f"mu_n={s.get('mu_n', math.nan):.3f} alpha1={s['alpha1']:.3f} alpha2={s['alpha2']:.3f} "
                f"violating={int(s['num_violating'])} mean_loss={s['mean_loss']:.4f}",
                flush=True,
            )
        return out

    MargOHNMMiner.mine = traced  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--train-classes", type=int, default=200)
    parser.add_argument("--test-classes", type=int, default=100)
    parser.add_argument("--seen-classes", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--trace", type=int, default=0, help="print MargOHNM's stats every N calls")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.trace:
        trace_margohnm(args.trace)
    background = load("omniglot:background", args.data_root, 28)
    evaluation = load("omniglot:evaluation", args.data_root, 28)
    train_data = background.subset(background.classes[: args.train_classes])
    seen = background.subset(background.classes[: args.seen_classes])
    test = evaluation.subset(evaluation.classes[: args.test_classes])
    print(
        f"train {len(train_data.y)} images of {args.train_classes} classes, test {len(test.y)} of "
        f"{args.test_classes}, {args.iterations} iterations, P x K 32 x 4, seed {args.seed}"
    )
    print(f"{'run':20} {'MAP@R':>7} {'P@1':>6} {'floor':>7} {'emb MAP@R':>10} {'emb floor':>10} {'seen':>6} {'s':>5}")
    for name in args.runs:
        loss_params, miner = RUNS[name]
        config = TrainConfig(
            trunk="conv4",
            embedding_dim=64,
            loss="quadruplet",
            loss_params=loss_params,
            miner=miner,
            P=32,
            K=4,
            iterations=args.iterations,
            seed=args.seed,
        )
        start = time.perf_counter()
        base = floor(config, train_data, test)
        result = train(config, train_data)
        metric = pair_scorer_of(result.loss_module)
        got = evaluate(result.model, test, clustering=False, normalize=True, metric=metric)
        saw = evaluate(result.model, seen, clustering=False, normalize=True, metric=metric)
        emb, emb_floor = got.get("embedding_map_at_r", got["map_at_r"]), base.get("embedding_map_at_r", math.nan)
        print(
            f"{name:20} {got['map_at_r']:7.3f} {got['precision_at_1']:6.3f} {base['map_at_r']:7.3f} "
            f"{emb:10.3f} {emb_floor:10.3f} {saw['map_at_r']:6.3f} {time.perf_counter() - start:5.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
