"""The learned metric's ``g`` over every pair on the CPU, by a small C kernel compiled on first use.

Ranking a test set by ``g`` scores every (query, reference) pair with a
3 x 10 MLP. Run as torch operations (`LearnedMetric.tile`) each layer is a
tiny matrix product written to memory and read back, at 70-170 ns a pair on
one core; ``_pair_kernel.c`` keeps a block of 64 pairs in vector registers
through every layer (`benchmarks/bench_learned_ranking.py --kernel`).

The kernel is compiled with the machine's C compiler (``$CC``, else ``cc``;
``-O3 -march=native``) into dmlbench's cache (`bench.data.cache.cache_dir`),
keyed by the source, the compiler and the CPU's flags, so a cache shared
by two machines never runs one's code on the other. Where it cannot be had
(no compiler, a failed build, ``DMLBENCH_PAIR_KERNEL=0``, weights not
float32, more than `MAX_HIDDEN` units) `scores` returns None and the caller
uses the torch tiles: the same ``g`` up to float rounding, only slower.
`status` says which path this process takes and why. ``metric`` below is a
`bench.losses.learned_metric.LearnedMetric` (not imported: that module imports this one).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

SOURCE = Path(__file__).with_name("_pair_kernel.c")
BLOCK = 64  # the kernel's BLK: references are zero-padded to a multiple of it
MAX_HIDDEN = 64  # the kernel's HMAX: its per-block buffers are sized for at most this many units
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC")

_loaded: tuple[ctypes.CDLL | None, str] | None = None  # (library, why not) once tried in this process


def status() -> str:
    """One line: whether this process scores ``g`` by the kernel, and why not where it does not."""
    lib, why = _library()
    return f"compiled kernel ({why})" if lib is not None else f"torch tiles: {why}"


def applies(metric: Any) -> bool:
    """Whether `scores` takes this metric: float32 weights on the CPU, at most `MAX_HIDDEN` units, a kernel built."""
    w = metric.first.weight
    if torch.nn.parameter.is_lazy(w) or w.dtype != torch.float32 or w.device.type != "cpu":
        return False  # a lazy first layer is made by the torch path's first call (its width is the input's)
    if metric.hidden > MAX_HIDDEN:
        return False
    return _library()[0] is not None


def pair_cost(metric: Any) -> int:
    """Float values held per scored pair by `scores`: the two directions' logits for ``concat`` (symmetrised
    in place), one logit for ``difference_product`` plus one for its (rows, hidden, dim) product weights,
    which stay under a value a pair where the references number a few thousand or more."""
    return 2


def scores(metric: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """``g(x_a, y_b)`` for every a, b, float32 (len(x), len(y)), or None where the kernel does not apply.
    Rows are split across torch's intra-op threads (the kernel releases the GIL)."""
    if not applies(metric):
        return None
    if not (bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all())):
        return None  # the kernel's ReLU turns NaN into 0; the torch layers carry it to the caller's check
    lib = _library()[0]
    assert lib is not None
    args = _Arguments(metric, x.float().contiguous(), y.float().contiguous())
    threads = max(1, min(torch.get_num_threads(), len(x)))
    if threads == 1:
        return args.run(lib, 0, len(x))
    bounds = [len(x) * t // threads for t in range(threads + 1)]
    with ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(lambda t: args.run(lib, bounds[t], bounds[t + 1]), range(threads)))
    return torch.cat(parts)


class _Arguments:
    """The kernel's inputs for one (x, y) pair of sets: the first layer split into each side's part."""

    def __init__(self, metric: Any, x: torch.Tensor, y: torch.Tensor) -> None:
        *inner, last = metric.rest
        linear = [m for m in inner if isinstance(m, torch.nn.Linear)]
        d, h = x.shape[1], metric.hidden
        w, b = metric.first.weight.detach(), metric.first.bias.detach()
        self.concat, self.x, self.h, self.d, self.m = metric.pair_input == "concat", x, h, d, len(y)
        self.layers = len(linear)
        empty = torch.zeros(1)
        self.ws = torch.stack([m.weight.detach() for m in linear]).contiguous() if linear else empty
        self.bs = torch.stack([m.bias.detach() for m in linear]).contiguous() if linear else empty
        assert isinstance(last, torch.nn.Linear)
        self.v = (last.weight[1] - last.weight[0]).detach().contiguous()  # softmax([z0, z1])[1] = sigmoid(z1 - z0)
        self.c = float((last.bias[1] - last.bias[0]).detach())
        w1, w2 = w[:, :d], w[:, d:]
        if self.concat:  # h([x; y]) = first layer W1 x + b + W2 y: each side's part once per sample
            self.a1, self.a2 = (x @ w1.T + b).contiguous(), (x @ w2.T).contiguous()
            self.b1t, self.b2t = _padded((y @ w1.T + b).T), _padded((y @ w2.T).T)
        else:
            self.yt, self.w1, self.w2, self.b0 = _padded(y.T), w1.contiguous(), w2.contiguous(), b.contiguous()

    def run(self, lib: ctypes.CDLL, s: int, e: int) -> torch.Tensor:
        """``g`` of rows ``s:e`` of x against every y."""
        n, m, h = e - s, self.m, self.h
        tail = (_ptr(self.ws), _ptr(self.bs), _ptr(self.v), ctypes.c_float(self.c))
        if self.concat:
            zf, zb = torch.empty(n, m), torch.empty(n, m)
            a1, a2 = self.a1[s:e].contiguous(), self.a2[s:e].contiguous()
            pad = self.b1t.shape[1]
            lib.g_concat(n, m, pad, h, self.layers, _ptr(a1), _ptr(a2), _ptr(self.b1t), _ptr(self.b2t), *tail,
                         _ptr(zf), _ptr(zb))  # fmt: skip
            return zf.sigmoid_().add_(zb.sigmoid_()).mul_(0.5)  # g = (h([x; y]) + h([y; x])) / 2
        x = self.x[s:e].contiguous()
        product = (x[:, None, :] * self.w2[None]).contiguous()  # (n, h, d): x_i * W2[k]
        z = torch.empty(n, m)
        lib.g_dp(n, m, self.yt.shape[1], self.d, h, self.layers, _ptr(x), _ptr(self.yt), _ptr(self.w1),
                 _ptr(product), _ptr(self.b0), *tail, _ptr(z))  # fmt: skip
        return z.sigmoid_()


def _padded(t: torch.Tensor) -> torch.Tensor:
    """(features, count) zero-padded to a multiple of `BLOCK` columns, contiguous (one copy of a transpose)."""
    out = torch.zeros(t.shape[0], t.shape[1] + (-t.shape[1]) % BLOCK)
    out[:, : t.shape[1]] = t
    return out


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _library() -> tuple[ctypes.CDLL | None, str]:
    """The compiled kernel, built into the cache on first use (once per process), or None and why not."""
    global _loaded
    if _loaded is None:
        _loaded = _load()
    return _loaded


def _load() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("DMLBENCH_PAIR_KERNEL", "1") == "0":
        return None, "DMLBENCH_PAIR_KERNEL=0"
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return None, f"no C compiler ({cc!r} not found; set CC)"
    try:  # a missing source (an install without its package data) or an unwritable cache: the torch tiles
        target = _built(cc)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"cannot build the kernel: {e}"
    if isinstance(target, str):
        return None, target
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        return None, f"cannot load {target}: {e}"
    for f in (lib.g_concat, lib.g_dp):
        f.restype = None
    return lib, f"{cc}, {target}"


def _built(cc: str) -> Path | str:
    """The kernel's shared library in the cache, built there if missing; or why the build failed."""
    from bench.data.cache import cache_dir

    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), _compiler_id(cc), " ".join(FLAGS).encode(), _cpu_id()):
        key.update(part)
    target = cache_dir() / "kernels" / f"pair_kernel-{key.hexdigest()[:20]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")  # then renamed: two workers may build at once
    done = subprocess.run([cc, *FLAGS, "-o", str(tmp), str(SOURCE)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        return f"{cc} failed: {(done.stderr.strip().splitlines() or ['no message'])[0]}"
    os.replace(tmp, target)
    return target


def _compiler_id(cc: str) -> bytes:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return b""


def _cpu_id() -> bytes:
    """The CPU's feature flags (Linux), else the platform's description: -march=native code is for this CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.encode()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}".encode()
