"""The CPU evaluation's shortcuts give the values of the plain path: the rearranged copy (`_folded`), batches of
any size, Lake's runs embedded in one pass, the artifacts' positive pairs without the N x N mask."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from bench.data import load, load_lake_runs
from bench.evaluation import _folded, _raw_embeddings, _runs_embedder, embed, evaluate
from bench.metrics import lake_runs_accuracy
from bench.registry import build_trunk
from bench.sweep.artifacts import positive_pairs

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def test_images(data_root: Path) -> torch.Tensor:
    return load("omniglot:evaluation", data_root, 28).x[:600]


@pytest.fixture(scope="module")
def runs(data_root: Path) -> list:
    return load_lake_runs(data_root, 28)


def _trained_like(seed: int = 0) -> nn.Module:
    """Conv-4 in eval mode with BatchNorm statistics and affine values a trained model has (not 0 / 1)."""
    torch.manual_seed(seed)
    model = build_trunk("conv4", in_shape=(1, 28, 28), embedding_dim=16).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.3, 0.3)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return model


def test_the_rearranged_copy_moves_each_relu_after_its_pool_bit_for_bit(test_images: torch.Tensor) -> None:
    model = _trained_like()
    copy = _folded(model, test_images, CPU)
    kinds = [type(m).__name__ for m in copy.features]
    assert kinds[:4] == ["Conv2d", "Identity", "MaxPool2d", "ReLU"] and kinds.count("BatchNorm2d") == 0
    assert [type(m).__name__ for m in model.features][:4] == ["Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d"]
    # the same fold without the swap: the swap alone changes no bit
    fold_only = _folded(model, test_images, CPU)
    for seq in [m for m in fold_only.modules() if isinstance(m, nn.Sequential)]:
        for i in range(len(seq) - 1):
            if isinstance(seq[i], nn.MaxPool2d) and isinstance(seq[i + 1], nn.ReLU):
                seq[i], seq[i + 1] = seq[i + 1], seq[i]
    assert [type(m).__name__ for m in fold_only.features][2:4] == ["ReLU", "MaxPool2d"]
    with torch.no_grad():
        assert torch.equal(copy(test_images), fold_only(test_images))
        assert torch.allclose(copy(test_images), model(test_images), atol=1e-5)
    # a pool that returns its indices, or a ReLU before something else, stays where it is
    odd = nn.Sequential(nn.ReLU(), nn.MaxPool2d(2, return_indices=True))
    assert _folded(odd, test_images, CPU) is odd
    kept = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.AvgPool2d(2)).eval()
    assert _folded(kept, test_images, CPU) is kept


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_row_does_not_depend_on_the_batch_it_is_in(test_images: torch.Tensor, channels_last: bool) -> None:
    """What the evaluation's batch size and Lake's one pass rely on, bit for bit: folded or not, in either memory
    order the model comes in."""
    model = _trained_like(1)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    for fold in (True, False):
        whole = _raw_embeddings(model, test_images, 512, CPU, fold=fold)
        for batch in (16, 64, 100, 256):
            assert torch.equal(_raw_embeddings(model, test_images, batch, CPU, fold=fold), whole), (fold, batch)
    first = test_images[:20]  # a set of 20, alone: too few for the fold, one batch
    assert torch.equal(embed(model, first), _raw_embeddings(model, test_images, 64, CPU, fold=False)[:20])


@pytest.mark.parametrize("channels_last", [False, True])
def test_lakes_runs_in_one_pass_equal_each_set_embedded_alone(runs: list, channels_last: bool) -> None:
    model = _trained_like(2)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    rows = _runs_embedder(model, runs, 512, CPU)
    for run in runs:
        for images in (run.train_x, run.test_x):
            assert torch.equal(rows(images), embed(model, images))
    other = runs[0].train_x.clone()  # not one of the runs' own sets: embedded as embed does
    assert torch.equal(rows(other), embed(model, other))
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d) and m.in_channels > 1)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) == channels_last  # left as it was


def test_evaluate_scores_lakes_runs_as_one_call_per_set_does(data_root: Path, runs: list) -> None:
    data = load("omniglot:evaluation", data_root, 28).subset(list(range(964, 1004)))
    model = _trained_like(3)
    for normalize in (False, True):
        scores = evaluate(model, data, lake_runs=runs, clustering=False, normalize=normalize)
        alone = lake_runs_accuracy(lambda x: embed(model, x, normalize=normalize), runs)["accuracy"]
        assert scores["lake_accuracy"] == alone


@pytest.mark.parametrize(("n", "classes"), [(3000, 150), (500, 480), (60, 3), (5, 5), (4, 1), (1, 1)])
def test_positive_pairs_are_the_masks_in_its_order(n: int, classes: int) -> None:
    y = torch.randint(0, classes, (n,), generator=torch.Generator().manual_seed(n)) * 7 + 964
    i, j = positive_pairs(y)
    mask_i, mask_j = torch.where((y[:, None] == y[None, :]).triu(1))
    assert torch.equal(i, mask_i) and torch.equal(j, mask_j)
    assert i.dtype == mask_i.dtype == torch.int64


def _spec(evaluation_precision: str | None, training_precision: str):
    """omniglot-quick's spec with the given ``evaluation.precision`` (None: absent) and training precision."""
    from bench.protocol import parse_protocol

    text = (Path(__file__).resolve().parents[1] / "protocols" / "omniglot-quick.yaml").read_text()
    text = re.sub(r"\n  precision: training[^\n]*", "", text)  # the shipped file's own setting, out
    assert "precision: training" not in text
    if evaluation_precision is not None:
        text = text.replace("  ks: [1, 2, 4, 8]\n", f"  ks: [1, 2, 4, 8]\n  precision: {evaluation_precision}\n")
    protocol = parse_protocol(text, "quick.yaml")
    assert protocol.spec.evaluation.precision == (evaluation_precision or "fp32")
    return protocol.with_precision(training_precision, True).spec


def test_scoring_precision_embeds_in_the_training_precision_only_when_asked(test_images: torch.Tensor) -> None:
    """``evaluation.precision: training`` embeds under the sweep's training autocast; fp32 (absent, written, or
    training in fp32) is the plain fp32 path bit for bit. The embeddings come back as fp32 either way."""
    from bench.evaluation import scoring_precision

    model = _trained_like()
    fp32 = embed(model, test_images)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = embed(model, test_images)
    assert (bf16 - fp32).abs().max() > 1e-4  # bf16 is another number, so the checks below can tell them apart
    for evaluation, training, expected in [
        (None, "bf16", fp32),
        ("fp32", "bf16", fp32),
        ("training", "fp32", fp32),
        ("training", "bf16", bf16),
    ]:
        with scoring_precision(_spec(evaluation, training)):
            got = embed(model, test_images)
        assert got.dtype == torch.float32 and torch.equal(got, expected), (evaluation, training)
    assert torch.equal(embed(model, test_images), fp32)  # the context ends with its block


def test_kept_embeddings_keep_each_precision_apart(test_images: torch.Tensor) -> None:
    """A model's test embedding kept in fp32 is not handed out for a bf16 scoring, nor the other way."""
    from bench.evaluation import kept_embeddings, scoring_precision

    model = _trained_like(1)
    fp32 = embed(model, test_images)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = embed(model, test_images)
    with kept_embeddings(test_images):
        assert torch.equal(embed(model, test_images), fp32)
        with scoring_precision(_spec("training", "bf16")):
            assert torch.equal(embed(model, test_images), bf16)
            assert torch.equal(embed(model, test_images), bf16)
        assert torch.equal(embed(model, test_images), fp32)


def test_scoring_precision_refuses_an_unresolved_auto() -> None:
    from bench.errors import BenchError
    from bench.evaluation import scoring_precision

    with pytest.raises(BenchError, match="auto is unresolved"), scoring_precision(_spec("training", "auto")):
        pass


def test_image_files_decode_outside_the_scoring_autocast(tmp_path: Path) -> None:
    """Image files streamed through the loader (and its forked workers) are decoded and resized as in fp32, and
    only the trunk's forward runs in bf16: the embeddings equal those of the decoded tensor under autocast. (A
    first version ran the decoding inside autocast, and the resize failed on a bfloat16 tensor.)"""
    from bench.data.images import ImageFiles
    from bench.evaluation import scoring_precision
    from tests._shared import write_folder

    write_folder(tmp_path / "faces", [f"p{i}" for i in range(4)], per_class=40, size=(40, 33))
    data = load(f"folder:{tmp_path / 'faces'}", size=28)
    assert isinstance(data.x, ImageFiles)  # streamed, not a tensor
    decoded = torch.stack([data.x.decode(i, False) for i in range(len(data.x))])
    model = _trained_like(2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = embed(model, decoded)
    with scoring_precision(_spec("training", "bf16")):
        got = embed(model, data.x)
    assert torch.equal(got, expected)
