"""Image files read lazily: `ImageFiles` stands where a dataset's tensor of images would be.

Only paths and the options to decode them are held (a numpy array of
strings, shared copy-on-write with forked loader workers without touching
reference counts), so memory does not grow with the number of images.
Images are decoded with Pillow, one at a time, in `DataLoader` workers
(`bench.data.loading`).

Decoding without ``data.augment`` (a side's pipeline left out) gives the
same tensors, bit for bit, as the in-memory loader did: float32 from
Pillow, made square as ``data.resize`` says and area-resampled to
``data.image_size``. With a pipeline, Pillow's RGB or L image goes through
the protocol's ``transforms.v2`` (`bench.data.augment`).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from bench.data.augment import build, head_length
from bench.data.resize import fit_square, resize_area
from bench.errors import BenchError
from bench.spec.schema import image_hw

MAX_PIXELS = 40_000_000  # a 6,000 x 6,000 photo; more is decoded into gigabytes of floats before resizing
GRAY_MODES = {"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}
SIXTEEN_BIT = {"I;16", "I;16B", "I;16L", "I;16N"}
DECODE_RULES = 2  # the value rules of `read_image` (in the data fingerprint): changed when a mode is read otherwise
_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601, as `bench.data.labeled.with_channels`


@dataclass(frozen=True, eq=False)
class ImageFiles:
    """Image files and how to decode them: what `LabeledData.x` holds for a dataset of files.

    It answers what the stages before the trunk ask of ``x``: ``len``,
    ``shape`` (N, C, size, size), ``dim()``, and indexing by a boolean mask
    or index tensor (a subset, still lazy). An integer index (``x[i]``,
    ``x[i, c]``) decodes one image with the evaluation pipeline. `augment` holds the normalised
    ``data.augment`` (`bench.data.augment.normalise`), `loader` the
    ``data.loader`` options, `cache` the decoded-image cache of each side
    (`bench.data.image_cache`), read when built.
    """

    root: Path
    paths: np.ndarray  # str array, relative to root
    size: int | tuple[int, int]  # a side, or (height, width) when data.augment ends at a non-square size
    resize: str = "stretch"
    channels: int = 3
    augment: Mapping[str, Any] = field(default_factory=dict)
    loader: Mapping[str, Any] = field(default_factory=dict)
    cache: Mapping[str, Any] = field(default_factory=dict)  # side -> `bench.data.image_cache.ImageCache`
    _pipelines: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.channels not in (1, 3):
            raise BenchError(f"image files: channels must be 1 or 3, got {self.channels!r}")
        object.__setattr__(self, "paths", np.asarray(self.paths, dtype=str).reshape(-1))

    def __len__(self) -> int:
        return int(self.paths.shape[0])

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self), self.channels, *image_hw(self.size))

    ndim = 4
    dtype = torch.float32

    def dim(self) -> int:
        return 4

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)):
            return self.decode(int(index), train=False)
        if isinstance(index, tuple) and index and isinstance(index[0], (int, np.integer)):
            return self.decode(int(index[0]), train=False)[index[1:]]  # x[i, c, ...] as on a tensor
        if isinstance(index, torch.Tensor):
            index = index.cpu().numpy()
        return replace(self, paths=self.paths[index], _pipelines={})

    def file(self, index: int) -> Path:
        return self.root / str(self.paths[index])

    def with_options(self, **changes: Any) -> ImageFiles:
        """The same files decoded otherwise (channels, augment, loader, cache)."""
        return replace(self, **changes, _pipelines={})

    def decode(self, index: int, train: bool) -> torch.Tensor:
        """Image `index` as float32 (C, size, size): the train or eval pipeline, with the global RNG as it is."""
        side = "train" if train else "eval"
        items = self.augment.get(side)
        file = self.file(index)
        if not items:
            if not isinstance(self.size, int):
                raise BenchError(
                    f"data.image_size {self.size[0]}x{self.size[1]} is not square: give "
                    f"data.augment.{side}, ending at that size"
                )
            image = _square(read_image(file), self.channels, self.resize, self.size)
        else:
            cached = self.cache.get(side)
            source: Any
            if cached is not None and cached.ready():  # the head's output, stored: only the rest runs here
                name = f"{side}:after-cache"
                if name not in self._pipelines:
                    self._pipelines[name] = build(items[len(cached.head) :], side)
                source, pipeline = cached.read(str(self.paths[index])), self._pipelines[name]
            else:
                if side not in self._pipelines:
                    self._pipelines[side] = build(items, side)
                with open_image(file) as img:
                    source, pipeline = eight_bit(img, self.channels, file), self._pipelines[side]
            try:
                image = pipeline(source)
            except Exception as err:  # noqa: BLE001 - a value torchvision accepted when built, refused on an image
                first = (str(err).strip().splitlines() or [""])[0][:160]
                raise BenchError(f"data.augment.{side} failed on {file}: {type(err).__name__}: {first}") from None
            image = image.as_subclass(torch.Tensor)
        self._check_shape(image, side, file)
        return image

    def head(self, index: int, train: bool) -> tuple[torch.Tensor, int]:
        """Image `index` through its side's deterministic head alone, as uint8 (C, H, W), and how many of the
        side's steps that was: from the cache when it is built (its head), else decoded here. What a loader
        worker sends to the device under ``data.loader.augment_on: device``; `tail` runs the rest there."""
        side = "train" if train else "eval"
        items = self.augment.get(side)
        if not items:
            raise BenchError(f"data.loader.augment_on: device needs data.augment.{side}")
        cached = self.cache.get(side)
        if cached is not None and cached.ready():
            return cached.read(str(self.paths[index])), len(cached.head)
        count = head_length(items)
        name = f"{side}:head"
        if name not in self._pipelines:
            self._pipelines[name] = build(items[:count], side, to_float=False)
        file = self.file(index)
        with open_image(file) as img:
            source = eight_bit(img, self.channels, file)
        return self._pipelines[name](source).as_subclass(torch.Tensor).contiguous(), count

    def tail(self, image: torch.Tensor, index: int, train: bool, start: int) -> torch.Tensor:
        """The side's pipeline from step `start` on, run on `image` (`head`'s output, on any device) with the
        global RNG as it is: the same image as `decode` on the CPU; its shape checked as `decode` checks."""
        side = "train" if train else "eval"
        name = f"{side}:after-{start}"
        if name not in self._pipelines:
            self._pipelines[name] = build(self.augment[side][start:], side)
        try:
            out = self._pipelines[name](image)
        except Exception as err:  # noqa: BLE001 - as in `decode`: a value refused on an image, one line
            first = (str(err).strip().splitlines() or [""])[0][:160]
            raise BenchError(
                f"data.augment.{side} failed on {self.file(index)}: {type(err).__name__}: {first}"
            ) from None
        out = out.as_subclass(torch.Tensor)
        self._check_shape(out, side, self.file(index))
        return out

    def _check_shape(self, image: torch.Tensor, side: str, file: Path) -> None:
        want = (self.channels, *image_hw(self.size))
        if tuple(image.shape) != want:
            raise BenchError(
                f"data.augment.{side} gives {'x'.join(map(str, image.shape))} (channels x height x "
                f"width) from {file}, but the protocol wants {'x'.join(map(str, want))} (data.channels, "
                f"data.image_size): end the pipeline at that size and channel count"
            )

    def to_tensor(self) -> torch.Tensor:
        """Every image decoded for evaluation, stacked: for small sets and tests only (what streaming avoids)."""
        return torch.stack([self.decode(i, train=False) for i in range(len(self))])


def sample_seed(seed: int, step: int, slot: int) -> int:
    """The RNG seed of one sample's augmentation: a function of the run seed, the batch and the place in it,
    so the images do not depend on which worker decoded them or how many there are."""
    digest = hashlib.sha256(f"augment:{seed}:{step}:{slot}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class open_image:  # noqa: N801 - used as a context manager, like open()
    """Pillow's image of `file`, with a missing, corrupt or oversized file as one line naming it."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.img: Image.Image | None = None

    def __enter__(self) -> Image.Image:
        try:
            self.img = pil_open(self.file)
            check_pixels(self.img, self.file)
            self.img.load()
            return self.img
        except BenchError:
            self.__exit__()
            raise
        except FileNotFoundError:
            raise BenchError(f"missing image file {self.file}") from None
        except Image.DecompressionBombError as err:
            raise BenchError(f"image {self.file} refused as a decompression bomb: {err}") from None
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
            self.__exit__()
            raise BenchError(f"corrupt or unreadable image {self.file} ({type(err).__name__})") from err

    def __exit__(self, *_: Any) -> None:
        if self.img is not None:
            self.img.close()


def read_image(file: Path) -> np.ndarray:
    """One image as float32 (C, H, W) in [0, 1], C = 1 for grey modes and 3 otherwise; alpha dropped.

    Each Pillow mode is read by its real range (`scale_wide`): 8-bit modes (1, L, P, LA, PA, RGB, RGBA, RGBX,
    CMYK, YCbCr, HSV) through Pillow's conversion to L or RGB, over 255 (LAB refused: `convert_mode`); 16-bit grey (I;16 and its
    byte orders) over 65535; 32-bit integers (I) by the depth the file declares; floats (F) as they are,
    in [0, 1]. A value outside its range, or a mode Pillow cannot convert, is refused in one line.
    """
    with open_image(file) as img:
        mode = img.mode
        if mode.startswith(("I", "F")):
            return scale_wide(img, file)[None]
        target = "L" if mode in GRAY_MODES else "RGB"
        arr = np.asarray(convert_mode(img, target, file), dtype=np.float32)
        return (arr[None] if target == "L" else arr.transpose(2, 0, 1)) / 255.0


def eight_bit(img: Image.Image, channels: int, file: Path) -> Image.Image:
    """The image in the 8-bit mode a v2 pipeline starts from ("L" or "RGB"). Pillow's convert() clips a
    16-bit or float image instead of scaling it (16-bit grey came out white, floats in [0, 1] black), so
    those are scaled as `read_image` scales them, refused where it refuses them, then quantised."""
    if img.mode.startswith(("I", "F")):
        grey = np.rint(scale_wide(img, file) * 255.0).astype(np.uint8)
        img = Image.fromarray(grey, mode="L")
    return convert_mode(img, "RGB" if channels == 3 else "L", file)


def convert_mode(img: Image.Image, mode: str, file: Path) -> Image.Image:
    """An 8-bit image in `mode` ("L" or "RGB") by Pillow's conversion; a mode it has none for, or only an
    approximate one (CIELAB: off by up to a tenth of the range on dark colours), is refused in one line."""
    if img.mode == "LAB":
        raise BenchError(
            f"{file}: Pillow mode LAB is not read: its conversion to RGB is approximate; save the image as RGB"
        )
    try:
        return img.convert(mode)
    except ValueError:  # Pillow has no conversion from this mode: refused, not guessed
        raise BenchError(
            f"{file}: Pillow mode {img.mode} cannot be converted to {mode}: save the image as 8-bit grey or RGB"
        ) from None


def integer_top(img: Image.Image) -> tuple[int, str]:
    """The largest value of a mode-I image's samples and where that comes from.

    Pillow holds every integer image of more than 8 bits as 32-bit ``I`` whatever the file stored, so
    the container's range says nothing; the file's declared depth does. A PGM/PPM of maxval above 255
    is scaled by Pillow to 0..65535; a TIFF declares its bits per sample (8 or 16: 255 or 65535). A
    32-bit sample, or a format that declares nothing, has no range a reader can know: its values are
    read as 8-bit (0..255, the common case of 8-bit data stored wide), and a larger one is refused."""
    if img.format == "PPM":
        return 65535, "16-bit PGM"
    if img.format == "TIFF":
        bits = getattr(img, "tag_v2", {}).get(258)
        bits = bits[0] if isinstance(bits, tuple) and bits else bits
        if isinstance(bits, int) and 1 <= bits <= 16:
            return 2**bits - 1, f"{bits}-bit TIFF"
    return 255, "32-bit integers, read as 8-bit since their range is not declared"


def pil_open(file: Any) -> Image.Image:
    """`PIL.Image.open` without PIL's decompression-bomb warning: PIL warns above its own limit (89 million
    pixels) and raises above twice that, and every caller refuses above ``MAX_PIXELS`` (`check_pixels`) right
    after opening, so the warning would only print a second message beside the refusal's one line."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(file)


def check_pixels(img: Image.Image, file: Path) -> None:
    if img.width * img.height > MAX_PIXELS:
        raise BenchError(
            f"image {file} declares {img.width} x {img.height} pixels, more "
            f"than {MAX_PIXELS:,}: refused as a possible decompression bomb"
        )


def image_channels(file: Path) -> int:
    """1 or 3, from the file's header alone (nothing is decoded); a file that is no image, or one whose
    header declares a decompression bomb, is named now, before a run records anything."""
    try:
        with pil_open(file) as img:
            check_pixels(img, file)
            return 1 if img.mode in GRAY_MODES else 3
    except FileNotFoundError:
        raise BenchError(f"missing image file {file}") from None
    except Image.DecompressionBombError as err:
        raise BenchError(f"image {file} refused as a decompression bomb: {err}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise BenchError(f"corrupt or unreadable image {file} ({type(err).__name__})") from err


def scale_wide(img: Image.Image, file: Path) -> np.ndarray:
    """A grey image of a mode wider than 8 bits as float32 in [0, 1], by the range of its mode (I;16: 65535;
    I: `integer_top`; F: as stored), or one line naming the mode and the values outside that range."""
    mode = img.mode
    arr = np.asarray(img)
    if mode == "F":
        if not np.isfinite(arr).all():
            raise BenchError(f"{file}: float image (mode F) holds NaN or infinity: images must be finite")
        if arr.size and (arr.min() < 0 or arr.max() > 1):
            raise BenchError(f"{file}: float image values must lie in [0, 1], found {arr.min()}..{arr.max()}")
        return arr.astype(np.float32)
    if mode in SIXTEEN_BIT:
        return arr.astype(np.float32) / 65535.0
    if mode != "I":
        raise BenchError(f"{file}: Pillow mode {mode} is not read: save the image as 8-bit grey, 16-bit grey or RGB")
    top, why = integer_top(img)
    lo, hi = (int(arr.min()), int(arr.max())) if arr.size else (0, 0)
    if lo < 0 or hi > top:
        raise BenchError(
            f"{file}: mode I image holds values {lo}..{hi}, outside 0..{top} ({why}): save it as 8-bit (L) "
            "or 16-bit (I;16) grey"
        )
    return arr.astype(np.float32) / np.float32(top)  # float32 division, as for 8-bit images: equal values agree


def _square(image: np.ndarray, channels: int, resize: str, size: int) -> torch.Tensor:
    """Square and area-resampled in the file's own channels, then grey repeated or RGB made grey by the
    luma of `with_channels`, so a file gives the tensor the in-memory loader gave it."""
    t = torch.from_numpy(resize_area(fit_square(image[None], resize), size))
    if t.shape[1] == 1 and channels == 3:
        t = t.repeat(1, 3, 1, 1)
    elif t.shape[1] == 3 and channels == 1:
        weights = torch.tensor(_LUMA, dtype=torch.float32).view(1, 3, 1, 1)
        t = (t * weights).sum(dim=1, keepdim=True).clamp_(0.0, 1.0)
    return t[0]
