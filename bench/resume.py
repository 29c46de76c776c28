"""A training run's place, saved while it trains, so that the next attempt at the same run goes on from it.

A sweep's worker that is stopped (Ctrl-C, SIGTERM, ``--stop-after``, the end of a session) gives its
running trial or final seed back, and the next worker to claim it trained it from iteration 1 again: a unit
longer than the time a machine is lent never ended. `train` now saves the run's whole state to a
`RunState` file at the end of an iteration, at most every ``every_s`` seconds, and a later attempt with the
same identity loads it and goes on from the next iteration. The state is everything the rest of the run
reads: the trunk's, the loss's and the miner's parameters and buffers, the optimiser's (and a grad
scaler's) state, every random generator (the run's own, torch's, NumPy's and Python's), the losses so far,
the counters, and early stopping's best checkpoint and patience. On the same hardware the resumed run is
the uninterrupted one bit for bit (tests/test_resume.py, for every loss and miner).

A loss or miner may keep state outside its parameters: a call counter for a warm-up, adaptive margins, a
cached mining result. `attributes` takes, besides a module's ``state_dict``, every plain attribute (numbers,
strings, tensors, and lists and dicts of them) of the trunk, the loss and the miner and of every object they
hold, so a method needs nothing of its own to be resumed.

The identity is what decides the numbers: the run's key (its unit in the sweep), its `TrainConfig`, its
``stop_after`` and early stopping, the code (a digest of the ``bench`` package's sources), torch's version,
the device type and torch's thread count. A state saved under another identity is removed and the run
starts over. A state names the hardware of each part it trained on (`parts`), which the run's records keep.

Not resumed (they start over, as before): runs under a pruner (its reports belong to the Optuna trial
given back) and runs of a dataset-level miner (its own mining state is not saved).

The file is written whole or not at all (`bench.atomic`), and removed once the run has ended, whatever
its outcome (`clear`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import random
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.atomic import atomic_file

log = logging.getLogger("dmlbench.resume")

# the most training time lost to an interruption (plus one sync interval): a lent GPU's call ends by SIGTERM,
# and its next call goes on from the last save; a save of a small trunk's state takes milliseconds
EVERY_S = 20.0
FOLDER = "resume"  # in a protocol's results folder: the states of runs given back, a folder per cell
SUFFIX = ".pt"


@functools.cache
def code_digest() -> str:
    """A digest of the ``bench`` package's Python sources: two attempts share a state only with equal code."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def state_path(folder: str | Path, key: str, kind: str = "unit") -> Path:
    """The state file of the run with ``key`` in ``folder``: ``<kind>-<digest of the key>.pt`` (a key holds
    slashes; the kind, a sweep's ``unit`` or a ``budget`` check's seed, lets each clear its own)."""
    return Path(folder) / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:24]}{SUFFIX}"


def clear_kind(folder: str | Path, kind: str = "unit") -> None:
    """Remove every state of ``kind`` in ``folder``, once no run of that kind is left there to go on (a
    cell's units all recorded): a state left by a run that ended elsewhere (a lent GPU, another machine), and
    the temp file of a write a kill -9 cut short (`bench.atomic`)."""
    for pattern in (f"{kind}-*{SUFFIX}", f".{kind}-*{SUFFIX}-*.tmp"):
        for path in Path(folder).glob(pattern):
            path.unlink(missing_ok=True)


class RunState:
    """Where one run's state is saved and read back: ``path``, for the run ``key``; saved at most every
    ``every_s`` seconds of training (0: at every sync point, as the tests do; None: `EVERY_S`)."""

    def __init__(
        self,
        path: str | Path,
        key: str,
        every_s: float | None = None,
        on_resume: Callable[[int], None] | None = None,
    ) -> None:
        self.path, self.key = Path(path), key
        self.every_s = EVERY_S if every_s is None else every_s
        self.saved_at = time.monotonic()
        self.resumed_at = 0  # the iteration the run went on from (0: it started at the beginning)
        self.parts: list[dict[str, Any]] = []  # the earlier attempts' hardware and iterations
        # told the iteration a run goes on from, as it does (`Progress.resumed`): the time left is paced by what
        # this process trains, not by the iterations an earlier attempt trained
        self.on_resume = on_resume

    def identity(self, **settings: Any) -> dict[str, Any]:
        """The identity a saved state must match: the key, ``settings`` (the run's config and budget), the code,
        torch's version and thread count."""
        return {
            "key": self.key,
            **settings,
            "code": code_digest(),
            "torch": str(torch.__version__),
            "threads": torch.get_num_threads(),
        }

    def saved_iteration(self, device: str) -> int:
        """The last iteration of the saved state that a run on ``device`` (a type: "cpu", "cuda") here would go on
        from: 0 where there is none, or its code, torch, thread count or device type differ from this process's
        (`load` would discard it). For planning what fits in a time limit; `load` checks the whole identity."""
        if not self.path.is_file():
            return 0
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception:  # damaged: `load` starts the run over
            return 0
        identity = state.get("identity") if isinstance(state, dict) else None
        here = self.identity(device=device)  # the run's config aside, which only `train` knows
        if not isinstance(identity, dict) or any(identity.get(k) != v for k, v in here.items()):
            return 0
        return int(state.get("it", 0))

    def due(self) -> bool:
        """Whether a save is due (``every_s`` seconds since the last save or the start)."""
        return time.monotonic() - self.saved_at >= self.every_s

    def load(self, identity: dict[str, Any]) -> dict[str, Any] | None:
        """The saved state of this run, or None (none saved, or saved under another identity: then removed)."""
        if not self.path.is_file():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as e:  # a damaged file (a full disk, another torch): the run starts over
            log.warning(f"{self.path}: the saved training state cannot be read ({type(e).__name__}): starting over")
            self.clear()
            return None
        if not isinstance(state, dict) or state.get("identity") != identity:
            log.warning(f"{self.path}: a training state saved by other code or settings: starting over")
            self.clear()
            return None
        self.resumed_at = int(state["it"])
        self.parts = list(state.get("parts", []))
        if self.on_resume is not None:
            self.on_resume(self.resumed_at)
        return state

    def save(self, state: dict[str, Any]) -> None:
        """Write ``state`` whole (a kill mid-write leaves the previous one)."""
        with atomic_file(self.path, "wb") as f:
            torch.save(state, f)
        self.saved_at = time.monotonic()

    def clear(self) -> None:
        """The run has ended (or its state is unusable): remove its state."""
        self.path.unlink(missing_ok=True)

    def described(self) -> str:
        """The earlier attempts, as the run's records say it ("" for a run that was not resumed)."""
        if not self.resumed_at:
            return ""
        spans = "; ".join(f"iterations {p['first']}-{p['last']} on {p['device']}" for p in self.parts)
        return f"resumed at iteration {self.resumed_at + 1}: {spans}"


def generators_state(generator: torch.Generator) -> dict[str, Any]:
    """Every random generator a run reads, in tensors and plain values (what ``weights_only`` loading takes)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {
        "run": generator.get_state(),
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached)],
        "python": [version, list(internal), gauss],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_generators(generator: torch.Generator, state: dict[str, Any]) -> None:
    """Set every generator `generators_state` saved."""
    generator.set_state(state["run"])
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def resumed_tag(resumed: str) -> dict[str, str]:
    """A resumed run's MLflow tag (its earlier parts); none for a run trained in one go."""
    return {"resumed": resumed[:500]} if resumed else {}


_MODULE_KEYS = frozenset(vars(nn.Module()))  # a bare module's own bookkeeping: its state is its state_dict's
_NOT_STATE = (
    type,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.ModuleType,
    functools.partial,
)


def _plain(value: Any) -> bool:
    # exact types: a NumPy scalar (a float subclass) would not load back under ``weights_only``
    if value is None or type(value) in (bool, int, float, str) or isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _plain(v) for k, v in value.items())
    return False


def _held(obj: Any) -> dict[str, Any]:
    """The objects ``obj`` holds whose own attributes may change: a module's children, other objects."""
    held = {}
    for name, value in vars(obj).items():
        if isinstance(obj, nn.Module) and name == "_modules":
            held.update({f"module:{child}": m for child, m in value.items() if m is not None})
        elif not _plain(value) and hasattr(value, "__dict__") and not isinstance(value, _NOT_STATE):
            if not (isinstance(obj, nn.Module) and name in _MODULE_KEYS):
                held[name] = value
    return held


def attributes(obj: Any, seen: set[int] | None = None) -> dict[str, Any]:
    """Every plain attribute of ``obj`` (a module's bookkeeping aside) and, nested, of the objects it holds."""
    seen = set() if seen is None else seen
    if obj is None or id(obj) in seen or not hasattr(obj, "__dict__"):
        return {}
    seen.add(id(obj))
    module = isinstance(obj, nn.Module)
    plain = {k: v for k, v in vars(obj).items() if not (module and k in _MODULE_KEYS) and _plain(v)}
    held = {name: attributes(value, seen) for name, value in _held(obj).items()}
    return {"plain": plain, "held": {k: v for k, v in held.items() if v}}


def set_attributes(obj: Any, state: dict[str, Any]) -> None:
    """Set what `attributes` took (tensors onto the device of the attribute they replace)."""
    if not state:
        return
    for name, value in state["plain"].items():
        current = getattr(obj, name, None)
        if isinstance(value, torch.Tensor) and isinstance(current, torch.Tensor):
            value = value.to(current.device)
        setattr(obj, name, value)
    for name, nested in state["held"].items():
        set_attributes(
            obj._modules[name[len("module:") :]] if name.startswith("module:") else getattr(obj, name), nested
        )
