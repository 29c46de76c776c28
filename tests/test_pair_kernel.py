"""The compiled pair kernel (`bench.losses.pair_kernel`) scores the same g as the torch layouts, or stands aside."""

from __future__ import annotations

import shutil

import pytest
import torch

from bench.losses import pair_kernel
from bench.losses.learned_metric import PAIR_INPUTS, LearnedMetric, PairScorer


@pytest.fixture
def needs_kernel() -> None:
    """Skips where this machine cannot build the kernel (no C compiler): the fallback tests below still run."""
    if pair_kernel._library()[0] is None:
        pytest.skip(f"no pair kernel: {pair_kernel.status()}")


def metric(pair_input: str, hidden: int, layers: int, dim: int, seed: int = 0) -> LearnedMetric:
    torch.manual_seed(seed)
    m = LearnedMetric(hidden=hidden, layers=layers, pair_input=pair_input)
    m.materialize(dim)
    return m


@pytest.mark.usefixtures("needs_kernel")
@pytest.mark.parametrize("pair_input", PAIR_INPUTS)
@pytest.mark.parametrize(("hidden", "layers", "n", "m", "dim"), [
    (10, 3, 37, 200, 64),  # the protocols' metric; references not a multiple of the 64-wide block
    (7, 1, 5, 64, 9),  # odd units (one computed alone), no hidden-to-hidden layer, exactly one block
    (1, 4, 3, 1, 3),  # one unit, one reference
    (64, 2, 4, 130, 16),  # the widest the kernel takes
])  # fmt: skip
def test_the_kernel_scores_the_g_of_the_row_layout(pair_input, hidden, layers, n, m, dim) -> None:
    g = metric(pair_input, hidden, layers, dim)
    x, y = torch.randn(n, dim), torch.randn(m, dim)
    with torch.no_grad():
        want = g.scores(x, y)
    got = pair_kernel.scores(g, x, y)
    assert got is not None and got.dtype == torch.float32 and got.shape == (n, m)
    assert torch.allclose(got, want, rtol=0, atol=2e-6)
    # a symmetric metric: the kernel's g of (y, x) is the transpose, whichever side is padded
    assert torch.allclose(pair_kernel.scores(g, y, x), got.T, rtol=0, atol=2e-6)


@pytest.mark.usefixtures("needs_kernel")
@pytest.mark.parametrize("pair_input", PAIR_INPUTS)
def test_rows_split_across_threads_give_the_same_g(pair_input: str) -> None:
    g = metric(pair_input, 10, 3, 32)
    x, y = torch.randn(50, 32), torch.randn(70, 32)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = pair_kernel.scores(g, x, y)
        torch.set_num_threads(3)
        three = pair_kernel.scores(g, x, y)
    finally:
        torch.set_num_threads(before)
    assert one is not None and three is not None and torch.equal(one, three)


@pytest.mark.usefixtures("needs_kernel")
def test_pair_scorer_uses_the_kernel_and_ranks_as_the_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """`PairScorer` on the CPU takes the kernel; with it switched off, the torch tiles give the same g."""
    g = metric("difference_product", 10, 3, 16)
    s = PairScorer(g, normalize=True)
    q, r = s.prepare(torch.randn(20, 16)), s.prepare(torch.randn(90, 16))
    fused = s(q, r)
    calls: list[int] = []
    monkeypatch.setattr(pair_kernel, "scores", lambda *a: calls.append(1))  # returns None: the tiles' path
    tiled = s(q, r)
    assert calls == [1] and torch.allclose(fused, tiled, rtol=0, atol=2e-6)
    assert torch.equal(fused.argsort(dim=1, stable=True)[:, :5], tiled.argsort(dim=1, stable=True)[:, :5])


def test_where_the_kernel_does_not_apply_the_scorer_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """float64 weights, more units than the kernel holds, an embedding not finite: None, and `PairScorer`
    still scores by the tiles (which carry a NaN to the ranking's check)."""
    wide = metric("concat", pair_kernel.MAX_HIDDEN + 1, 2, 4)
    x = torch.randn(3, 4)
    assert pair_kernel.scores(wide, x, x) is None
    nan = x.clone()
    nan[1, 2] = float("nan")
    assert pair_kernel.scores(metric("difference_product", 10, 3, 4), nan, x) is None
    assert torch.isnan(PairScorer(metric("difference_product", 10, 3, 4), normalize=False)(nan, x)[1]).all()
    assert pair_kernel.scores(metric("concat", 5, 2, 4).double(), x.double(), x.double()) is None
    assert PairScorer(wide, normalize=False)(x, x).shape == (3, 3)


@pytest.mark.parametrize(("env", "why"), [
    ({"DMLBENCH_PAIR_KERNEL": "0"}, "DMLBENCH_PAIR_KERNEL=0"),
    ({"CC": "/nonexistent/cc"}, "no C compiler"),
    ({"CC": "false"}, "false failed"),  # a compiler that fails: its first line, or "no message"
    ({"DMLBENCH_CACHE": "/proc/no-cache-here"}, "cannot build the kernel"),  # a cache that cannot be written
])  # fmt: skip
def test_without_a_compiler_the_kernel_says_why_and_g_is_still_scored(env, why, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("DMLBENCH_CACHE", str(tmp_path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if "CC" not in env and not shutil.which("cc"):
        pytest.skip("no C compiler: the cache is never reached")
    monkeypatch.setattr(pair_kernel, "_loaded", None)
    g = metric("concat", 10, 3, 8)
    x = torch.randn(6, 8)
    assert pair_kernel.scores(g, x, x) is None
    assert pair_kernel.status().startswith("torch tiles: ") and why in pair_kernel.status()
    with torch.no_grad():
        assert torch.allclose(PairScorer(g, normalize=False)(x, x), g.scores(x, x), rtol=0, atol=1e-6)
    assert not list(tmp_path.rglob("*.so"))


@pytest.mark.usefixtures("needs_kernel")
def test_the_kernel_is_built_once_into_the_cache_and_reused(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("DMLBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(pair_kernel, "_loaded", None)
    assert pair_kernel.status().startswith("compiled kernel")
    built = list((tmp_path / "kernels").glob("pair_kernel-*.so"))
    assert len(built) == 1 and not list(tmp_path.rglob("*.tmp"))
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(pair_kernel, "_loaded", None)
    monkeypatch.setenv("CC", "false")  # another compiler is another key: not the cached build, and it fails
    assert pair_kernel.status().startswith("torch tiles")
    monkeypatch.delenv("CC")
    monkeypatch.setattr(pair_kernel, "_loaded", None)
    assert pair_kernel.status().startswith("compiled kernel") and built[0].stat().st_mtime_ns == stamp


def test_a_metric_not_yet_materialised_is_left_to_the_torch_path() -> None:
    """The first layer's width comes from the first input (a lazy layer): the torch path makes it; the kernel
    takes the metric from then on."""
    g = LearnedMetric(hidden=10, layers=3, pair_input="concat")
    assert not pair_kernel.applies(g)
    x = torch.randn(5, 6)
    got = PairScorer(g, normalize=True)(x, x)
    assert got.shape == (5, 5) and not torch.nn.parameter.is_lazy(g.first.weight)
    assert pair_kernel.applies(g) or pair_kernel._library()[0] is None
