"""Pair-loss cost: lifted structure and InfoNCE, forward and backward, own vs PML in the same run.

A PK batch (default B=512, K=4, dim 128, float32). PML builds a positive x
negative matrix (B(K-1) x B(B-K) entries: 400 million here), the own losses
a B x B one. Time: own and PML alternate within each round, so that machine
load hits both alike, and the medians are compared; PML takes seconds per
step, so it runs only ``--pml-runs`` times per loss. Memory: each side runs
once in a fresh subprocess, which reports its peak resident set size
(``VmHWM``: ``getrusage``'s ``ru_maxrss`` would inherit the parent's) minus
its resident size just before the step (after imports, inputs and a warm-up
step on a tiny batch). Both sides must give the same value and gradient
(float32 rounding: relative difference below 1e-4).

    .venv/bin/python benchmarks/bench_pair_losses.py [--batch 512 --k 4 --dim 128 --own-runs 20 --pml-runs 1 --threads 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the checkout

LOSSES = ("lifted_structure", "infonce")


def build(name: str, side: str) -> Callable:
    """The loss module of one side, with the settings that make both equal (see bench.crosscheck.losses)."""
    if side == "own":
        from bench.registry import build_loss

        return build_loss(name, margin=1.0) if name == "lifted_structure" else build_loss(name, temperature=0.1)
    from pytorch_metric_learning import losses

    return (
        losses.LiftedStructureLoss(neg_margin=1.0, pos_margin=0.0)
        if name == "lifted_structure"
        else losses.NTXentLoss(temperature=0.1)
    )


def inputs(batch: int, k: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(batch // k).repeat_interleave(k)[torch.randperm(batch, generator=g)]
    return torch.randn(batch, dim, generator=g), labels


def step(loss: Callable, x: torch.Tensor, y: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Seconds for one forward and backward pass, the value and the gradient."""
    e = x.detach().clone().requires_grad_(True)
    start = time.perf_counter()
    value = loss(e, y)
    value.backward()
    return time.perf_counter() - start, value.detach(), e.grad


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    """This process's own peak RSS.

    ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` would do, but Linux carries
    it over ``fork``/``exec`` from the parent (which may have run PML just
    before); ``VmHWM`` belongs to the new process image alone.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child_peak(args: argparse.Namespace) -> None:
    """In a fresh process: the extra peak memory of one step of one side, as JSON on stdout."""
    torch.set_num_threads(args.threads)
    name, side = args.memory
    x, y = inputs(args.batch, args.k, args.dim, args.seed)
    loss = build(name, side)
    step(loss, *inputs(2 * args.k, args.k, args.dim, args.seed))  # one-time library set-up is not the loss's memory
    baseline = rss_bytes()
    step(loss, x, y)
    print(json.dumps({"peak_bytes": max(peak_rss_bytes() - baseline, 0), "baseline_bytes": baseline}))


def peak_memory(name: str, side: str, args: argparse.Namespace) -> int:
    cmd = [
        sys.executable,
        __file__,
        "--memory",
        name,
        side,
        "--batch",
        str(args.batch),
        "--k",
        str(args.k),
        "--dim",
        str(args.dim),
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_bytes"]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / max(float(a.abs().max()), float(b.abs().max()), 1e-30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--own-runs", type=int, default=20)
    parser.add_argument("--pml-runs", type=int, default=1)  # plus one more in the memory subprocess
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory", nargs=2, metavar=("LOSS", "SIDE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory:
        return child_peak(args)
    torch.set_num_threads(args.threads)
    x, y = inputs(args.batch, args.k, args.dim, args.seed)

    print(
        f"B={args.batch} K={args.k} dim={args.dim} float32 threads={args.threads}; forward+backward; "
        f"median of {args.own_runs} own / {args.pml_runs} PML runs, alternating; peak memory in fresh processes"
    )
    print(
        f"{'loss':<17} {'own ms':>8} {'PML ms':>9} {'speed':>8} {'own MB':>7} {'PML MB':>8} {'memory':>8}"
        f"  value (own / PML)        rel diff value, grad"
    )
    for name in LOSSES:
        own, pml = build(name, "own"), build(name, "pml")
        step(own, x, y)  # warm-up
        own_t, pml_t = [], []
        per_round = max(args.own_runs // args.pml_runs, 1)
        for _ in range(args.pml_runs):
            t, pml_v, pml_g = step(pml, x, y)
            pml_t.append(t)
            for _ in range(per_round):
                t, own_v, own_g = step(own, x, y)
                own_t.append(t)
        o, p = statistics.median(own_t), statistics.median(pml_t)
        own_m, pml_m = peak_memory(name, "own", args), peak_memory(name, "pml", args)
        dv, dg = rel(own_v, pml_v), rel(own_g, pml_g)
        print(
            f"{name:<17} {o * 1e3:8.2f} {p * 1e3:9.0f} {p / o:7.0f}x {own_m / 2**20:7.1f} {pml_m / 2**20:8.0f}"
            f" {pml_m / max(own_m, 1):7.0f}x  {float(own_v):.6g} / {float(pml_v):.6g}  {dv:.1e}, {dg:.1e}"
            f"  {'OK' if max(dv, dg) < 1e-4 else 'DIFFERENT'}"
        )


if __name__ == "__main__":
    main()
