"""Pretrained weights (``model.pretrained``): from a local file or the torch hub cache, never downloaded.

``model.pretrained`` is one of:

* ``hub`` or ``hub:<VARIANT>``: the trunk's published ImageNet weights
  (torchvision's DEFAULT, or e.g. ``hub:IMAGENET1K_V1``), looked up under
  ``torch.hub.get_dir()/checkpoints/`` by the file name torchvision's
  download would give it;
* a bare file name (``resnet50-0676ba61.pth``): that file in the same folder;
* a path (with a ``/``, or ``~``): that file.

Nothing is fetched at run time: a sweep on a cluster must not depend on a
download, and a missing file is one line naming the file and where to put
it. Files load with ``torch.load(weights_only=True)`` (no pickled code) or
safetensors. A file whose name carries torch hub's hash prefix
(``name-<sha256 prefix>.pth``) is checked against it, as
``torch.hub.load_state_dict_from_url(check_hash=True)`` would.

A file fits a `Backbone` when its keys are the body's plus, at most, the
published classifier's (``fc.*``; BN-Inception's ``last_linear.*``), which is
dropped; or when it is a whole dmlbench trunk's state_dict (``body.*`` and
``embed.*``). Any other trunk takes its own full state_dict. BN-Inception's
published file keeps BatchNorm tensors as ``(1, C)``: they are read as
``(C,)`` (`bench.models.bninception.fit_published`).
"""

from __future__ import annotations

import hashlib
import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from bench.errors import BenchError
from bench.models.backbones import RESNETS, Backbone, published_weights
from bench.models.bninception import BNInceptionBody, fit_published
from bench.vision import torchvision

HUB = "hub"
_HASH = re.compile(r"-([a-f0-9]{8,})\.[A-Za-z]+$")  # torch.hub's convention: the sha256 prefix before the suffix


def hub_checkpoints() -> Path:
    """The folder torch hub downloads weights to, where ``hub`` and bare file names are looked up."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def resolve(spec: str, trunk: str) -> Path:
    """The file ``model.pretrained: spec`` names for ``trunk``; a BenchError saying where to put it when absent."""
    if not isinstance(spec, str) or not spec.strip():
        raise BenchError(
            f"model.pretrained must be a file, a file name in the torch hub cache, hub or null, got {spec!r}"
        )
    if spec == HUB or spec.startswith(HUB + ":"):
        name, what = published_weights(trunk, spec.partition(":")[2] or None)
        path = hub_checkpoints() / name
        if not path.is_file():
            raise BenchError(f"model.pretrained: {name} not found: put {what} at {path} or give a path")
        return path
    if "/" not in spec and "\\" not in spec and not spec.startswith("~"):
        path = hub_checkpoints() / spec
        if not path.is_file():
            raise BenchError(f"model.pretrained: {spec} not found: put {_known(spec, trunk)} at {path} or give a path")
        return path
    path = Path(spec).expanduser()
    if path.is_dir():
        raise BenchError(f"model.pretrained: {path} is a directory: give the weights file in it")
    if not path.is_file():
        raise BenchError(f"model.pretrained: {path} not found: put {_known(spec, trunk)} there or give another path")
    return path


def _known(spec: str, trunk: str) -> str:
    """What a file name is, when it is one of the trunk's published files; else 'the weights file'."""
    if trunk == "bninception":
        name, what = published_weights(trunk)
        if Path(spec).name == name:
            return what
    if trunk in RESNETS:
        for weights in torchvision().models.get_model_weights(trunk):
            name, what = published_weights(trunk, weights.name)
            if Path(spec).name == name:
                return what
    return f"the weights file for trunk {trunk!r}"


def _check_hash(path: Path) -> None:
    match = _HASH.search(path.name)
    if match is None:
        return
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if not digest.hexdigest().startswith(match.group(1)):
        raise BenchError(
            f"model.pretrained: {path} has sha256 {digest.hexdigest()[:12]}..., its name says "
            f"{match.group(1)}...: a damaged or different file"
        )


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A state_dict from a .safetensors or a torch file (``weights_only=True``), on the CPU."""
    _check_hash(path)
    try:
        with warnings.catch_warnings():  # torch's advice on weights_only is not the user's to act on
            warnings.simplefilter("ignore")
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                state = load_file(str(path), device="cpu")
            else:
                state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - unpickling and format errors of every kind: one line naming the file
        raise BenchError(f"model.pretrained: {path} {_unreadable(e)}") from None
    if not isinstance(state, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise BenchError(
            f"model.pretrained: {path} holds a {type(state).__name__}, not a state_dict (names to tensors)"
        )
    return dict(state)


def _unreadable(e: Exception) -> str:
    """Why a weights file did not load, in words a user can act on (torch's own messages suggest
    ``weights_only=False``, which would run the file's code, or quote a paragraph on zip archives)."""
    text = str(e)
    if isinstance(e, pickle.UnpicklingError) and "weights_only" in text.lower():
        return (
            "holds Python objects besides tensors, which dmlbench does not unpickle (it loads with "
            "weights_only=True): save the model's state_dict() alone, or as .safetensors"
        )
    first = (text.strip().splitlines() or [type(e).__name__])[0]
    return (
        f"cannot be read as a torch checkpoint or a .safetensors file (truncated, or another format): "
        f"{type(e).__name__}: {first[:100]}"
    )


def load_pretrained(trunk: nn.Module, path: Path, name: str) -> None:
    """Copy the weights in ``path`` into ``trunk`` (named ``name`` in messages); a mismatch is one line."""
    state = read_state_dict(path)
    target: nn.Module = trunk
    skip = ""
    if isinstance(trunk, Backbone) and not all(k.startswith(("body.", "embed.")) for k in state):
        target, skip = trunk.body, trunk.classifier
    own = target.state_dict()
    given = {k: v for k, v in state.items() if not (skip and k.startswith(skip + "."))}
    if isinstance(target, BNInceptionBody):  # the published file's (1, C) BatchNorm tensors
        given = fit_published(given, own)
    missing = [k for k in own if k not in given and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in given if k not in own]
    reshaped = [k for k in given if k in own and given[k].shape != own[k].shape]
    if missing or unexpected or reshaped:
        parts = [
            f"{len(missing)} missing key(s)" + (f" (e.g. {missing[0]})" if missing else ""),
            f"{len(unexpected)} unexpected" + (f" (e.g. {unexpected[0]})" if unexpected else ""),
        ]
        if reshaped:
            k = reshaped[0]
            parts.append(
                f"{len(reshaped)} of another shape (e.g. {k}: {tuple(given[k].shape)} in the file, "
                f"{tuple(own[k].shape)} in the trunk)"
            )
        raise BenchError(f"model.pretrained: {path} does not fit trunk {name!r}: {', '.join(parts)}")
    target.load_state_dict(given, strict=False)  # only num_batches_tracked may be absent (files before torch 0.4.1)
