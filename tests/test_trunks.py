"""ImageNet trunks: build and train in fp32 and bf16, frozen BatchNorm, trunk_lr, weights files, protocol keys."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from bench.cell import build_cell as build
from bench.cell import optimizer as _optimizer
from bench.data import LabeledData
from bench.errors import BenchError
from bench.models.weights import hub_checkpoints
from bench.protocol import ProtocolError, load_protocol, parse_protocol
from bench.training import TrainConfig, _set_lr, lr_factor, train
from bench.trunks import trunk_from
from bench.vision import torchvision

REPO = Path(__file__).resolve().parents[1]
TRUNKS = ["resnet18", "resnet50", "timm:resnet18"]


@pytest.fixture(scope="module")
def rgb() -> LabeledData:
    """4 classes x 4 random RGB images of 64x64: batches of 2 classes x 4 = 8 images."""
    g = torch.Generator().manual_seed(0)
    return LabeledData(torch.rand(16, 3, 64, 64, generator=g), torch.arange(4).repeat_interleave(4), "rgb")


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty torch hub cache in tmp_path (torch.hub.get_dir reads TORCH_HOME)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(torch.hub, "_hub_dir", None)
    folder = hub_checkpoints()
    folder.mkdir(parents=True)
    return folder


def config(trunk: str, **changes) -> TrainConfig:
    base = dict(trunk=trunk, embedding_dim=16, loss="triplet", P=2, K=4, iterations=2, seed=0, lr=1e-3)
    return TrainConfig(**{**base, **changes})


def bn_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


@pytest.mark.slow
@pytest.mark.parametrize("trunk", TRUNKS)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_trunk_trains_in_fp32_and_bf16_channels_last(trunk: str, precision: str, rgb: LabeledData) -> None:
    torch.manual_seed(0)
    before = {k: v.clone() for k, v in trunk_from(trunk, (3, 64, 64), 16, {}).state_dict().items()}
    result = train(config(trunk, precision=precision), rgb)
    assert result.status == "ok" and torch.isfinite(torch.tensor(result.final_loss))
    after = result.model.state_dict()
    assert before.keys() == after.keys()
    changed = [k for k in before if before[k].is_floating_point() and not torch.equal(before[k], after[k])]
    assert "embed.weight" in changed and any(k.startswith("body.") and "conv" in k for k in changed)
    conv = next(m for m in result.model.modules() if isinstance(m, nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) == (precision == "bf16")
    with torch.no_grad():
        out = result.model(rgb.x[:3])
    assert out.shape == (3, 16) and out.dtype == torch.float32


@pytest.mark.slow
def test_frozen_batchnorm_keeps_running_stats_and_trains_affine(rgb: LabeledData) -> None:
    torch.manual_seed(0)
    initial = trunk_from("resnet18", (3, 64, 64), 16, {})
    stats = {k: v.clone() for k, v in initial.state_dict().items() if "running" in k or "num_batches" in k}
    affine = {k: v.clone() for k, v in initial.state_dict().items() if k.endswith("bn1.weight")}
    frozen = train(config("resnet18", freeze_bn=True, iterations=3), rgb).model.state_dict()
    assert all(torch.equal(frozen[k], v) for k, v in stats.items())  # eval mode through model.train() calls
    assert any(not torch.equal(frozen[k], v) for k, v in affine.items())  # trained, as PML's trainer does
    free = train(config("resnet18", iterations=3), rgb).model.state_dict()
    assert any(not torch.equal(free[k], v) for k, v in stats.items() if "running_mean" in k)


def test_frozen_batchnorm_holds_after_train_and_needs_batchnorm() -> None:
    model = trunk_from("conv4", (3, 32, 32), 8, {}, freeze_bn=True)
    model.train()
    bn = bn_layers(model)[0]
    mean = bn.running_mean.clone()
    model(torch.rand(4, 3, 32, 32) * 5 + 3)
    assert torch.equal(bn.running_mean, mean) and not bn.training
    with pytest.raises(BenchError, match="no BatchNorm layer"):
        trunk_from("mlp", (3, 8, 8), 8, {}, freeze_bn=True)


@pytest.mark.parametrize("trunk", ["resnet18", "conv4"])
def test_trunk_lr_gives_two_groups_both_scheduled(trunk: str) -> None:
    cfg = config(
        trunk, loss="pml:proxy_anchor", trunk_lr=1e-5, lr=1e-2, schedule={"type": "cosine", "warmup": 2}, iterations=10
    )
    cfg.check()
    model, loss, _ = build(cfg, (3, 64, 64), 4, torch.device("cpu"))
    optimizer = _optimizer(cfg, model, loss)
    body, head = optimizer.param_groups
    assert (body["lr"], head["lr"]) == (1e-5, 1e-2)
    ids = lambda group: {id(p) for p in group["params"]}  # noqa: E731
    assert ids(head) == {id(p) for p in [*model.embed.parameters(), *loss.parameters()]}
    assert ids(body) | ids(head) == {id(p) for p in [*model.parameters(), *loss.parameters()]}
    base = [g["lr"] for g in optimizer.param_groups]
    for it in (1, 6):
        _set_lr(optimizer, base, lr_factor(cfg.schedule, it, cfg.iterations))
        factor = lr_factor(cfg.schedule, it, cfg.iterations)
        assert 0 < factor < 1
        assert body["lr"] == pytest.approx(1e-5 * factor) and head["lr"] == pytest.approx(1e-2 * factor)
    single = _optimizer(config(trunk), model, loss)
    assert len(single.param_groups) == 1


def test_trunk_lr_moves_the_body_less_than_the_head() -> None:
    g = torch.Generator().manual_seed(1)
    data = LabeledData(torch.rand(16, 3, 32, 32, generator=g), torch.arange(4).repeat_interleave(4), "rgb32")
    torch.manual_seed(0)
    start = trunk_from("conv4", (3, 32, 32), 16, {}).state_dict()
    end = train(config("conv4", trunk_lr=1e-9, lr=1e-2, iterations=5), data).model.state_dict()
    moved = {
        k: float((end[k] - start[k]).abs().max()) for k in start if start[k].is_floating_point() and "running" not in k
    }
    assert moved["embed.weight"] > 1e-3
    assert max(v for k, v in moved.items() if not k.startswith("embed.")) < 1e-7


def _random_resnet18_file(path: Path) -> dict[str, torch.Tensor]:
    torch.manual_seed(123)
    state = torchvision().models.resnet18(weights=None).state_dict()
    torch.save(state, path)
    return state


def test_pretrained_file_round_trip(tmp_path: Path) -> None:
    state = _random_resnet18_file(tmp_path / "weights.pth")
    torch.manual_seed(0)
    trunk = trunk_from("resnet18", (3, 64, 64), 16, {}, pretrained=str(tmp_path / "weights.pth"))
    body = trunk.body.state_dict()
    assert set(state) - set(body) == {"fc.weight", "fc.bias"}  # the published classifier, dropped
    assert all(torch.equal(body[k], v) for k, v in body.items() if k in state for v in [state[k]])
    torch.manual_seed(0)
    fresh = trunk_from("resnet18", (3, 64, 64), 16, {})
    assert torch.equal(trunk.embed.weight, fresh.embed.weight)  # loading draws no random number
    assert not torch.equal(trunk.body.conv1.weight, fresh.body.conv1.weight)


def test_pretrained_from_the_hub_cache_by_name_and_hash(hub: Path) -> None:
    state = _random_resnet18_file(hub / "mine.pth")
    trunk = trunk_from("resnet18", (3, 64, 64), 8, {}, pretrained="mine.pth")
    assert torch.equal(trunk.body.layer4[1].conv2.weight, state["layer4.1.conv2.weight"])
    (hub / "resnet18-deadbeef.pth").write_bytes((hub / "mine.pth").read_bytes())
    with pytest.raises(BenchError, match=r"name says deadbeef\.\.\.: a damaged or different file"):
        trunk_from("resnet18", (3, 64, 64), 8, {}, pretrained="resnet18-deadbeef.pth")


def test_missing_weights_say_which_file_goes_where(hub: Path, tmp_path: Path) -> None:
    with pytest.raises(BenchError) as info:
        config("resnet50", pretrained="hub").check()
    assert str(info.value) == (
        f"model.pretrained: resnet50-11ad3fa6.pth not found: put torchvision's ResNet-50 "
        f"weights (IMAGENET1K_V2) at {hub / 'resnet50-11ad3fa6.pth'} or give a path"
    )
    with pytest.raises(
        BenchError,
        match=r"resnet50-0676ba61\.pth not found: put torchvision's ResNet-50 weights "
        r"\(IMAGENET1K_V1\) at ",
    ):
        config("resnet50", pretrained="resnet50-0676ba61.pth").check()
    with pytest.raises(BenchError, match=r"IMAGENET1K_V1\) at .*resnet50-0676ba61\.pth"):
        config("resnet50", pretrained="hub:IMAGENET1K_V1").check()
    with pytest.raises(BenchError, match="not found: put the weights file for trunk 'resnet18' there"):
        config("resnet18", pretrained=str(tmp_path / "nowhere" / "w.pth")).check()
    with pytest.raises(BenchError, match="trunk 'conv4' has no published weights"):
        config("conv4", pretrained="hub").check()


def test_weights_of_another_trunk_are_one_line_with_counts(tmp_path: Path) -> None:
    torch.save(torchvision().models.resnet50(weights=None).state_dict(), tmp_path / "r50.pth")
    with pytest.raises(BenchError) as info:
        trunk_from("resnet18", (3, 64, 64), 8, {}, pretrained=str(tmp_path / "r50.pth"))
    message = str(info.value)
    assert "\n" not in message and "does not fit trunk 'resnet18'" in message
    assert "0 missing key(s)" in message and "unexpected (e.g. layer1.0.conv3.weight)" in message
    assert "of another shape (e.g. layer1.0.conv1.weight: (64, 64, 1, 1) in the file, (64, 64, 3, 3)" in message
    torch.save({"not": "tensors"}, tmp_path / "junk.pth")
    with pytest.raises(BenchError, match="holds a dict, not a state_dict"):
        trunk_from("resnet18", (3, 64, 64), 8, {}, pretrained=str(tmp_path / "junk.pth"))


def test_timm_trunk_and_its_safetensors_weights(tmp_path: Path) -> None:
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(7)
    state = timm.create_model("resnet18", pretrained=False).state_dict()  # with its classifier, as published
    save_file(state, str(tmp_path / "model.safetensors"))
    trunk = trunk_from("timm:resnet18", (3, 64, 64), 8, {}, pretrained=str(tmp_path / "model.safetensors"))
    assert all(torch.equal(v, state[k]) for k, v in trunk.body.state_dict().items())
    with pytest.raises(BenchError, match="input 16x16 does not fit trunk 'timm:vit_tiny_patch16_224'"):
        trunk_from("timm:vit_tiny_patch16_224", (3, 16, 16), 8, {})
    with pytest.raises(BenchError, match="unknown timm model 'no_such_net'"):
        trunk_from("timm:no_such_net", (3, 64, 64), 8, {})


def test_timm_trunk_without_timm_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # what `import timm` meets where timm is not installed
    with pytest.raises(BenchError) as info:
        trunk_from("timm:resnet34", (3, 64, 64), 8, {})
    assert str(info.value) == "timm trunks need timm: pip install 'dmlbench[timm]'"


PROTOCOL = (REPO / "protocols" / "omniglot-quick.yaml").read_text()


def test_new_keys_keep_existing_hashes() -> None:
    quick = load_protocol(REPO / "protocols" / "omniglot-quick.yaml")
    # evaluation.precision: training (155ed2e8f1bc before)
    assert quick.hash == "4b7f40195b11cb8ece083535f8f01cd2db151bf19a6726c54488de131b889e51"
    lr = quick.doc["training"]["lr"]
    explicit = PROTOCOL.replace("\nmodel:\n", "\nmodel:\n  pretrained: null\n  freeze_bn: false\n", 1).replace(
        "\ntraining:\n", f"\ntraining:\n  trunk_lr: {lr}\n", 1
    )
    assert explicit != PROTOCOL and parse_protocol(explicit).hash == quick.hash
    other = PROTOCOL.replace("\ntraining:\n", f"\ntraining:\n  trunk_lr: {lr / 10}\n", 1)
    assert parse_protocol(other).hash != quick.hash


def test_protocol_checks_trunk_options_without_files(hub: Path) -> None:
    rgb = PROTOCOL.replace("\nmodel:\n", "\nmodel:\n  pretrained: hub\n  freeze_bn: true\n", 1).replace(
        "image_size: 28", "image_size: 64"
    )
    trunk = next(line for line in PROTOCOL.splitlines() if line.strip().startswith("trunk:"))
    ok = parse_protocol(rgb.replace(trunk, "  trunk: resnet18"))  # no weights file needed to validate or plan
    assert ok.doc["model"]["pretrained"] == "hub" and ok.doc["model"]["freeze_bn"] is True
    with pytest.raises(ProtocolError) as info:
        parse_protocol(rgb.replace(trunk, "  trunk: mlp"))
    text = "\n".join(info.value.problems)
    assert "model.pretrained: trunk 'mlp' has no published weights" in text
    assert "model.freeze_bn: the trunk has no BatchNorm layer to freeze" in text
    from bench.sweep.preflight import check_weights

    with pytest.raises(BenchError, match="resnet18-f37072fd.pth not found"):
        check_weights(ok)  # a sweep refuses to start, rather than fail every trial


def test_unreadable_weights_files_are_one_line_saying_what_to_do(tmp_path: Path, recwarn) -> None:
    """torch's own messages suggest weights_only=False (which would run the file's code) or quote a paragraph
    on zip archives: dmlbench says what the file is and what to save instead, without torch's warnings."""
    good = tmp_path / "good.pth"
    torch.save(torchvision().models.resnet18(weights=None).state_dict(), good)
    (tmp_path / "text.pth").write_text("these are not weights\n")
    (tmp_path / "cut.pth").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    torch.save(torchvision().models.resnet18(weights=None), tmp_path / "module.pth")  # a whole pickled model
    expected = {
        "text.pth": "cannot be read as a torch checkpoint",
        "cut.pth": "cannot be read as a torch checkpoint",
        "module.pth": "save the model's state_dict() alone",
    }
    for name, words in expected.items():
        with pytest.raises(BenchError) as info:
            trunk_from("resnet18", (3, 64, 64), 8, {}, pretrained=str(tmp_path / name))
        message = str(info.value)
        assert "\n" not in message and len(message.replace(str(tmp_path), "")) < 250 and words in message, message
        assert "weights_only=False" not in message
    assert not [w for w in recwarn if "weights_only" in str(w.message)]
    with pytest.raises(BenchError, match="is a directory: give the weights file in it"):
        trunk_from("resnet18", (3, 64, 64), 8, {}, pretrained=str(tmp_path))


def test_a_sweep_with_a_damaged_weights_file_refuses_before_recording(tmp_path: Path, hub: Path) -> None:
    """Inside a trial a bad file is a failed trial, and the failed trials would use up the tuning budget: the
    sweep loads the weights into its trunk before the first trial, and records nothing."""
    from bench.cli import main

    torch.save(torchvision().models.resnet50(weights=None).state_dict(), tmp_path / "r50.pth")
    trunk = next(line for line in PROTOCOL.splitlines() if line.strip().startswith("trunk:"))
    text = (
        PROTOCOL.replace(trunk, "  trunk: resnet18")
        .replace("\nmodel:\n", f"\nmodel:\n  pretrained: {tmp_path / 'r50.pth'}\n", 1)
        .replace("image_size: 28", "image_size: 32")
    )
    path = tmp_path / "p.yaml"
    path.write_text(text)
    store = tmp_path / "store"
    code = main(
        [
            "run",
            str(path),
            "--storage",
            f"sqlite:///{store / 'optuna.db'}",
            "--tracking-uri",
            str(store / "mlflow.db"),
            "--results-dir",
            str(store / "results"),
            "--quiet",
        ]
    )
    assert code == 2
    assert not (store / "optuna.db").exists() and not (store / "mlflow.db").exists()
