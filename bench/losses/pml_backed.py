"""Losses a fair leaderboard carries without an own implementation: PML's, behind our call convention.

Each adapter builds the PML loss with PML's defaults and the parameter names
of the registry, checks the inputs like every dmlbench loss, and passes index
tuples through: triplets and pairs as they are (PML converts them itself),
``Quadruplets(i, j, l, k)`` as the distinct pairs they compare (positives
``(i, j)``, negatives ``(i, k)`` and ``(l, k)``). Proxy losses hold their
proxies as parameters, so ``.parameters()`` hands them to the optimiser, and
refuse labels outside ``[0, num_classes)`` (their proxy table's rows).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from bench.errors import BenchError
from bench.losses.base import BenchLoss, as_pairs, check_number
from bench.tuples import Quadruplets


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BenchError(f"{name} must be a positive integer, got {value!r}")
    return value


def _scaled(
    pml_class: Any,
    num_classes: int,
    embedding_size: int,
    margin: float,
    scale: float,
) -> tuple[torch.nn.Module, int]:
    """A PML proxy loss with a margin and a scale (ArcFace, CosFace), and its number of classes."""
    n, d = _count("num_classes", num_classes), _count("embedding_size", embedding_size)
    return pml_class(n, d, margin=margin, scale=check_number("scale", scale, low=0, strict=True)), n


def _own_lr(lr: float | None) -> float | None:
    """A loss's ``lr`` (its own parameters' learning rate): None, or a finite number > 0."""
    return None if lr is None else check_number("lr", lr, low=0, strict=True)


class _PMLLoss(BenchLoss):
    """Holds a PML loss module and calls it with validated inputs.

    ``param_lr`` is the learning rate of the loss's own parameters (proxies,
    a learned beta), which the training loop puts in a parameter group of
    their own (`bench.training`); None: they train at ``training.lr``.
    """

    def __init__(
        self, pml_loss: torch.nn.Module, num_classes: int | None = None, param_lr: float | None = None
    ) -> None:
        super().__init__(distance=None)  # PML's loss holds its own distance and reducer
        self.pml = pml_loss
        self.num_classes = num_classes
        self.param_lr = param_lr

    def compute(self, embeddings: torch.Tensor, labels: torch.Tensor, indices_tuple: Any) -> torch.Tensor:
        if self.num_classes is not None and len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise BenchError(
                f"{type(self).__name__} has proxies for labels 0..{self.num_classes - 1}, "
                f"got labels {int(labels.min())}..{int(labels.max())}"
            )
        if isinstance(indices_tuple, Quadruplets):
            indices_tuple = as_pairs(indices_tuple, labels)
        elif indices_tuple is not None:
            indices_tuple = tuple(indices_tuple)
        return self.pml(embeddings, labels, indices_tuple)


class MultiSimilarityLoss(_PMLLoss):
    """Wang et al. 2019: ``alpha`` weighs positive pairs, ``beta`` negative ones, around the similarity ``base``."""

    def __init__(self, alpha: float = 2.0, beta: float = 50.0, base: float = 0.5) -> None:
        from pytorch_metric_learning.losses import MultiSimilarityLoss as PML

        super().__init__(
            PML(
                alpha=check_number("alpha", alpha, low=0, strict=True),
                beta=check_number("beta", beta, low=0, strict=True),
                base=check_number("base", base),
            )
        )


class MarginLoss(_PMLLoss):
    """Wu et al. 2017: pairs on either side of a boundary ``beta`` by ``margin``; ``nu`` regularises a
    learned ``beta``; ``triplets_per_anchor`` caps the triplets read ("all" or a count).

    ``learn_beta`` makes ``beta`` a parameter (its initial value ``beta``),
    trained at ``lr`` (None: ``training.lr``); ``per_class`` gives each
    training class its own learned beta (the Reality Check's "Margin /
    class"; it implies ``learn_beta``). ``margin`` may be negative, as the
    Reality Check's search allowed.
    """

    def __init__(
        self,
        num_classes: int,
        margin: float = 0.2,
        nu: float = 0.0,
        beta: float = 1.2,
        triplets_per_anchor: int | str = "all",
        learn_beta: bool = False,
        per_class: bool = False,
        lr: float | None = None,
    ) -> None:
        from pytorch_metric_learning.losses import MarginLoss as PML

        if triplets_per_anchor != "all":
            _count("triplets_per_anchor", triplets_per_anchor)
        for name, flag in (("learn_beta", learn_beta), ("per_class", per_class)):
            if not isinstance(flag, bool):
                raise BenchError(f"{name} must be true or false, got {flag!r}")
        if lr is not None and not (learn_beta or per_class):
            raise BenchError("lr is the learned beta's learning rate: set learn_beta (or per_class) with it")
        super().__init__(
            PML(
                margin=check_number("margin", margin),
                nu=check_number("nu", nu, low=0),
                beta=check_number("beta", beta),
                triplets_per_anchor=triplets_per_anchor,
                learn_beta=learn_beta or per_class,
                num_classes=_count("num_classes", num_classes) if per_class else None,
            ),
            param_lr=_own_lr(lr),
        )


class ProxyAnchorLoss(_PMLLoss):
    """Kim et al. 2020: one learned proxy per training class (``num_classes`` x ``embedding_size``),
    ``margin`` and ``alpha`` as in the paper; labels must be 0..num_classes-1."""

    def __init__(self, num_classes: int, embedding_size: int, margin: float = 0.1, alpha: float = 32.0) -> None:
        from pytorch_metric_learning.losses import ProxyAnchorLoss as PML

        n, d = _count("num_classes", num_classes), _count("embedding_size", embedding_size)
        super().__init__(
            PML(n, d, margin=check_number("margin", margin), alpha=check_number("alpha", alpha, low=0, strict=True)), n
        )


class ArcFaceLoss(_PMLLoss):
    """``margin`` in degrees, as in PML; ``lr``: the class weights' learning rate (None: ``training.lr``)."""

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: float = 28.6,
        scale: float = 64.0,
        lr: float | None = None,
    ) -> None:
        from pytorch_metric_learning.losses import ArcFaceLoss as PML

        super().__init__(
            *_scaled(PML, num_classes, embedding_size, check_number("margin", margin, low=0, high=180), scale),
            param_lr=_own_lr(lr),
        )


class CosFaceLoss(_PMLLoss):
    """Wang et al. 2018: a cosine ``margin`` subtracted from the target class's logit, times ``scale``;
    ``lr``: the class weights' learning rate (None: ``training.lr``)."""

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: float = 0.35,
        scale: float = 64.0,
        lr: float | None = None,
    ) -> None:
        from pytorch_metric_learning.losses import CosFaceLoss as PML

        super().__init__(
            *_scaled(PML, num_classes, embedding_size, check_number("margin", margin), scale), param_lr=_own_lr(lr)
        )


class ProxyNCALoss(_PMLLoss):
    """Movshovitz-Attias et al. 2017: NCA against one learned proxy per class, logits times ``softmax_scale``;
    ``lr``: the proxies' learning rate (None: ``training.lr``)."""

    def __init__(
        self, num_classes: int, embedding_size: int, softmax_scale: float = 1.0, lr: float | None = None
    ) -> None:
        from pytorch_metric_learning.losses import ProxyNCALoss as PML

        n, d = _count("num_classes", num_classes), _count("embedding_size", embedding_size)
        scale = check_number("softmax_scale", softmax_scale, low=0, strict=True)
        super().__init__(PML(n, d, softmax_scale=scale), n, _own_lr(lr))


class NormalizedSoftmaxLoss(_PMLLoss):
    """Zhai and Wu 2018 (classification is a strong baseline): softmax over cosine similarities to
    normalised class weights at ``temperature``; ``lr``: the weights' learning rate (None: ``training.lr``)."""

    def __init__(
        self, num_classes: int, embedding_size: int, temperature: float = 0.05, lr: float | None = None
    ) -> None:
        from pytorch_metric_learning.losses import NormalizedSoftmaxLoss as PML

        n, d = _count("num_classes", num_classes), _count("embedding_size", embedding_size)
        t = check_number("temperature", temperature, low=0, strict=True)
        super().__init__(PML(n, d, temperature=t), n, _own_lr(lr))


class SoftTripleLoss(_PMLLoss):
    """Qian et al. 2019: ``centers_per_class`` learned centres per class, scale ``la``, ``gamma`` (PML divides
    by it: the paper's 1/gamma), ``margin``; ``reg_weight`` weighs PML's sparse-centres regulariser (0: off);
    ``lr``: the centres' learning rate (None: ``training.lr``)."""

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        centers_per_class: int = 10,
        la: float = 20.0,
        gamma: float = 0.1,
        margin: float = 0.01,
        reg_weight: float = 0.0,
        lr: float | None = None,
    ) -> None:
        from pytorch_metric_learning.losses import SoftTripleLoss as PML
        from pytorch_metric_learning.regularizers import SparseCentersRegularizer

        n, d = _count("num_classes", num_classes), _count("embedding_size", embedding_size)
        k = _count("centers_per_class", centers_per_class)
        weight = check_number("reg_weight", reg_weight, low=0)
        extra: dict[str, Any] = {}
        if weight > 0:
            extra = {"weight_regularizer": SparseCentersRegularizer(n, k), "weight_reg_weight": weight}
        pml = PML(
            n,
            d,
            centers_per_class=k,
            la=check_number("la", la, low=0, strict=True),
            gamma=check_number("gamma", gamma, low=0, strict=True),
            margin=check_number("margin", margin),
            **extra,
        )
        super().__init__(pml, n, _own_lr(lr))


class FastAPLoss(_PMLLoss):
    """Cakir et al. 2019: average precision through a histogram of ``num_bins`` soft distance bins."""

    def __init__(self, num_bins: int = 10) -> None:
        from pytorch_metric_learning.losses import FastAPLoss as PML

        if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 2:
            raise BenchError(f"num_bins must be an integer >= 2, got {num_bins!r}")
        super().__init__(PML(num_bins=num_bins))


class SNRContrastiveLoss(_PMLLoss):
    """Yuan et al. 2019: contrastive loss on the signal-to-noise ratio of pairs (``pos_margin``,
    ``neg_margin``), plus ``regularizer_weight`` times PML's zero-mean embedding regulariser (0: off)."""

    def __init__(self, pos_margin: float = 0.0, neg_margin: float = 1.0, regularizer_weight: float = 0.0) -> None:
        from pytorch_metric_learning.losses import SignalToNoiseRatioContrastiveLoss as PML
        from pytorch_metric_learning.regularizers import ZeroMeanRegularizer

        weight = check_number("regularizer_weight", regularizer_weight, low=0)
        extra: dict[str, Any] = {}
        if weight > 0:
            extra = {"embedding_regularizer": ZeroMeanRegularizer(), "embedding_reg_weight": weight}
        super().__init__(
            PML(
                pos_margin=check_number("pos_margin", pos_margin),
                neg_margin=check_number("neg_margin", neg_margin),
                **extra,
            )
        )


class SupConLoss(_PMLLoss):
    """Khosla et al. 2020: supervised contrastive loss over cosine similarities at ``temperature``."""

    def __init__(self, temperature: float = 0.1) -> None:
        from pytorch_metric_learning.losses import SupConLoss as PML

        super().__init__(PML(temperature=check_number("temperature", temperature, low=0, strict=True)))


class CircleLoss(_PMLLoss):
    """Sun et al. 2020: relaxation ``m`` and scale ``gamma`` weigh each pair by how far it is from its optimum."""

    def __init__(self, m: float = 0.4, gamma: float = 80.0) -> None:
        from pytorch_metric_learning.losses import CircleLoss as PML

        super().__init__(PML(m=check_number("m", m), gamma=check_number("gamma", gamma, low=0, strict=True)))


# ---- any other PML loss, by class name (`pml:NTXentLoss`) ---------------------------------------

# What a PML loss consumes where its base class does not say: proxy losses are those built with num_classes
_TUPLES = {
    "TripletMarginLoss": "triplets",
    "MarginLoss": "triplets",
    "NPairsLoss": "npair",
    "AngularLoss": "npair",
    "FastAPLoss": "pairs",  # ranks every pair of the batch (the built-in pml:fast_ap says the same)
}
# PML constructor arguments that are objects, not numbers a protocol can give
_OBJECTS = (
    "distance",
    "reducer",
    "embedding_regularizer",
    "embedding_reg_weight",
    "weight_regularizer",
    "weight_reg_weight",
    "weight_init_func",
    "collect_stats",
    "loss",
    "miner",
)
_PLAIN = (int, float, str, bool, type(None))


def plain_signature(pml_class: Any) -> inspect.Signature:
    """A PML constructor's parameters a protocol can set: required ones and those with a plain default, then
    those with a plain default of the base classes its ``**kwargs`` reach (PML passes them up: ProxyNCALoss's
    ``softmax_scale`` is NCALoss's, SignalToNoiseRatioContrastiveLoss's margins ContrastiveLoss's). A base's
    required parameter is the user's only when ``*args`` reach it (CosFaceLoss's ``num_classes``); otherwise
    the subclass gives it (GenericPairLoss's ``mat_based_loss``)."""
    own = list(inspect.signature(pml_class).parameters.values())
    keep = [p for p in own if _plain(p)]
    seen = {p.name for p in own}
    forwards = any(p.kind == p.VAR_KEYWORD for p in own)
    positional = any(p.kind == p.VAR_POSITIONAL for p in own)
    for base in pml_class.__mro__[1:]:
        if not forwards or base is torch.nn.Module or base is object:
            break
        if "__init__" not in vars(base):
            continue
        params = list(inspect.signature(base.__init__).parameters.values())[1:]  # without self
        keep += [p for p in params if p.name not in seen and (positional or p.default is not p.empty) and _plain(p)]
        seen |= {p.name for p in params}
        forwards = any(p.kind == p.VAR_KEYWORD for p in params)
        positional = positional and any(p.kind == p.VAR_POSITIONAL for p in params)
    keep.sort(key=lambda p: p.default is not p.empty)  # required first, as a signature must list them
    return inspect.Signature([p.replace(kind=p.KEYWORD_ONLY) for p in keep])


def _plain(p: inspect.Parameter) -> bool:
    return (
        p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and p.name not in _OBJECTS
        and (p.default is p.empty or isinstance(p.default, _PLAIN))
    )


def loss_tuples(name: str, pml_class: Any, signature: inspect.Signature) -> str:
    """What the loss consumes: declared for the known ones, else from its base class or a proxy table."""
    from pytorch_metric_learning.losses import GenericPairLoss

    if name in _TUPLES:
        return _TUPLES[name]
    if "num_classes" in signature.parameters:
        return "proxy"
    if issubclass(pml_class, GenericPairLoss):
        return "pairs"
    raise BenchError(
        f"pml:{name}: cannot tell which tuples it consumes; register it with "
        "bench.registry.register('loss', ..., tuples=...) around an adapter of your own"
    )


def adapter_class(
    namespace: dict[str, Any],
    name: str,
    base: type,
    pml_class: type,
    tuples: str,
    init_base: Callable[[Any, Any, dict[str, Any]], None],
) -> type:
    """``PML_<name>``: a ``base`` subclass whose constructor takes ``pml_class``'s plain parameters.

    Defined once in ``namespace`` (the adapters' module), so that the
    registry target ``module:PML_<name>`` and pickle find it by name.
    """
    signature = plain_signature(pml_class)

    def __init__(self: Any, **params: Any) -> None:
        try:
            pml = pml_class(**signature.bind(**params).arguments)
        except (TypeError, ValueError, AssertionError) as e:
            raise BenchError(f"pml:{name}: {e}") from None
        init_base(self, pml, params)

    cls = type(
        f"PML_{name}",
        (base,),
        {
            "__init__": __init__,
            "__signature__": signature,
            "tuples": tuples,
            "__module__": namespace["__name__"],
            "__doc__": f"PML's {name} behind dmlbench's call convention.",
        },
    )
    namespace[cls.__name__] = cls
    return cls


def lazy_adapters(adapter: Callable[[str], type], module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` building ``PML_<Class>`` on its first access (PEP 562)."""

    def __getattr__(attr: str) -> Any:
        if attr.startswith("PML_"):
            return adapter(attr[len("PML_") :])
        raise AttributeError(f"module {module!r} has no attribute {attr!r}")

    return __getattr__


def pml_class_of(module: Any, base: type, kind: str, name: str) -> type:
    """PML's class ``name`` of ``module`` (a subclass of ``base``), or a BenchError naming what was asked."""
    found = getattr(module, name, None)
    if not (isinstance(found, type) and issubclass(found, base)):
        raise BenchError(f"unknown {kind} 'pml:{name}': {module.__name__} has no {kind} class {name!r}")
    return found


def adapter(name: str) -> type:
    """A `_PMLLoss` subclass building PML's loss ``name`` from the registry's parameters (cached)."""
    from pytorch_metric_learning import losses

    if f"PML_{name}" in globals():
        return globals()[f"PML_{name}"]
    pml_class = pml_class_of(losses, losses.BaseMetricLossFunction, "loss", name)
    return adapter_class(
        globals(),
        name,
        _PMLLoss,
        pml_class,
        loss_tuples(name, pml_class, plain_signature(pml_class)),
        lambda self, pml, params: _PMLLoss.__init__(self, pml, params.get("num_classes")),
    )


__getattr__ = lazy_adapters(adapter, __name__)


__all__ = [
    "MultiSimilarityLoss",
    "MarginLoss",
    "ProxyAnchorLoss",
    "ArcFaceLoss",
    "CosFaceLoss",
    "SupConLoss",
    "CircleLoss",
    "ProxyNCALoss",
    "NormalizedSoftmaxLoss",
    "SoftTripleLoss",
    "FastAPLoss",
    "SNRContrastiveLoss",
]
