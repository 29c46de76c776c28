"""Resizing images the one way every reader does: area averaging, and squaring by stretch, pad or crop.

The same pixels give the same tensors whichever file format they came from.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from bench.errors import BenchError


def _area_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) weights of exact area (box) resampling along one axis.

    Output pixel i covers [i*s, (i+1)*s) input pixels, s = n_in/n_out; each
    input pixel contributes its overlap. Rows sum to 1, so [0, 1] stays
    [0, 1] and thin strokes fade to grey instead of vanishing (which nearest
    or non-antialiased bilinear sampling would do at 105 -> 28).
    """
    scale = n_in / n_out
    starts = np.arange(n_out)[:, None] * scale
    ends = starts + scale
    left = np.arange(n_in)[None, :]
    overlap = np.clip(np.minimum(ends, left + 1) - np.maximum(starts, left), 0.0, None)
    return (overlap / scale).astype(np.float32)


def fit_square(images: np.ndarray, mode: str) -> np.ndarray:
    """(N, C, H, W) made square before resizing, as the protocol's ``data.resize`` says.

    ``stretch`` keeps every pixel and changes the aspect ratio; ``pad`` keeps
    the aspect ratio and adds zeros (black) around the short side, centred;
    ``center_crop`` keeps the aspect ratio and drops the ends of the long side.
    """
    h, w = images.shape[-2:]
    if mode == "stretch" or h == w:
        return images
    if mode == "pad":
        side = max(h, w)
        top, left = (side - h) // 2, (side - w) // 2
        out = np.zeros((*images.shape[:-2], side, side), dtype=images.dtype)
        out[..., top : top + h, left : left + w] = images
        return out
    if mode == "center_crop":
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        return images[..., top : top + side, left : left + side]
    raise BenchError(f"data.resize: expected one of stretch, pad, center_crop, got {mode!r}")


def resize_area(
    images: np.ndarray, size: int, convert: Callable[[np.ndarray], np.ndarray] | None = None, chunk: int = 1024
) -> np.ndarray:
    """Resize (N, C, H, W) images to (N, C, size, size) by area averaging, in chunks.

    `convert` maps a chunk of raw values to float32 in [0, 1] (for example
    bool paper to float ink), so the full-resolution float copy, 850 MB for
    Omniglot's background set, never exists at once.
    """
    if size < 1:
        raise BenchError(f"image size must be a positive number of pixels, got {size}")
    n, c, h, w = images.shape
    rows = torch.from_numpy(_area_matrix(h, size))
    cols = torch.from_numpy(_area_matrix(w, size))
    out = np.empty((n, c, size, size), dtype=np.float32)
    for start in range(0, n, chunk):
        block = images[start : start + chunk]
        block = convert(block) if convert is not None else block
        t = torch.from_numpy(np.ascontiguousarray(block, dtype=np.float32))
        if (h, w) != (size, size):
            t = (rows @ t @ cols.T).clamp_(0.0, 1.0)  # (size, H) @ (.., H, W) @ (W, size); clamp float rounding
        out[start : start + chunk] = t.numpy()
    return out
