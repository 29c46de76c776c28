"""The Reality Check's own parts (issue 24): BN-Inception under its published names, its input step, the proxy
losses' own learning rate, and the three protocols' grid against the optima the paper published.

The key/shape table below is written from Cadene's ``pretrainedmodels/models/bninception.py`` (the layer list
of ``BNInception.__init__``), independently of `bench.models.bninception`'s own block table: a typo in either
shows up as a difference. The optima are those of powerful-benchmarker's ``docs/papers/mlrc.md`` ("Optimal
hyperparameters"), columns CUB200, Cars196 and SOP (batches of 32, as the protocols).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from bench.cell import build_cell as build_run
from bench.cell import optimizer as _optimizer
from bench.data import LabeledData
from bench.data.augment import build, check
from bench.errors import BenchError
from bench.models.bninception import BNInceptionBody, bninception, layer_shapes, side_fits
from bench.models.weights import hub_checkpoints
from bench.plan import plan
from bench.protocol import load_protocol, parse_protocol
from bench.sweep.probe import dead_parameters
from bench.training import TrainConfig, train
from bench.trunks import trunk_from

REPO = Path(__file__).resolve().parents[1]
PROTOCOLS = ["reality-check-cub", "reality-check-cars", "reality-check-sop"]

# Cadene's BNInception, convolution by convolution: name, in channels, out channels, kernel side.
# Every convolution has a bias and is followed by BatchNorm `<name>_bn` of `out` channels.
REFERENCE_CONVS = """
conv1_7x7_s2 3 64 7
conv2_3x3_reduce 64 64 1
conv2_3x3 64 192 3
inception_3a_1x1 192 64 1
inception_3a_3x3_reduce 192 64 1
inception_3a_3x3 64 64 3
inception_3a_double_3x3_reduce 192 64 1
inception_3a_double_3x3_1 64 96 3
inception_3a_double_3x3_2 96 96 3
inception_3a_pool_proj 192 32 1
inception_3b_1x1 256 64 1
inception_3b_3x3_reduce 256 64 1
inception_3b_3x3 64 96 3
inception_3b_double_3x3_reduce 256 64 1
inception_3b_double_3x3_1 64 96 3
inception_3b_double_3x3_2 96 96 3
inception_3b_pool_proj 256 64 1
inception_3c_3x3_reduce 320 128 1
inception_3c_3x3 128 160 3
inception_3c_double_3x3_reduce 320 64 1
inception_3c_double_3x3_1 64 96 3
inception_3c_double_3x3_2 96 96 3
inception_4a_1x1 576 224 1
inception_4a_3x3_reduce 576 64 1
inception_4a_3x3 64 96 3
inception_4a_double_3x3_reduce 576 96 1
inception_4a_double_3x3_1 96 128 3
inception_4a_double_3x3_2 128 128 3
inception_4a_pool_proj 576 128 1
inception_4b_1x1 576 192 1
inception_4b_3x3_reduce 576 96 1
inception_4b_3x3 96 128 3
inception_4b_double_3x3_reduce 576 96 1
inception_4b_double_3x3_1 96 128 3
inception_4b_double_3x3_2 128 128 3
inception_4b_pool_proj 576 128 1
inception_4c_1x1 576 160 1
inception_4c_3x3_reduce 576 128 1
inception_4c_3x3 128 160 3
inception_4c_double_3x3_reduce 576 128 1
inception_4c_double_3x3_1 128 160 3
inception_4c_double_3x3_2 160 160 3
inception_4c_pool_proj 576 128 1
inception_4d_1x1 608 96 1
inception_4d_3x3_reduce 608 128 1
inception_4d_3x3 128 192 3
inception_4d_double_3x3_reduce 608 160 1
inception_4d_double_3x3_1 160 192 3
inception_4d_double_3x3_2 192 192 3
inception_4d_pool_proj 608 128 1
inception_4e_3x3_reduce 608 128 1
inception_4e_3x3 128 192 3
inception_4e_double_3x3_reduce 608 192 1
inception_4e_double_3x3_1 192 256 3
inception_4e_double_3x3_2 256 256 3
inception_5a_1x1 1056 352 1
inception_5a_3x3_reduce 1056 192 1
inception_5a_3x3 192 320 3
inception_5a_double_3x3_reduce 1056 160 1
inception_5a_double_3x3_1 160 224 3
inception_5a_double_3x3_2 224 224 3
inception_5a_pool_proj 1056 128 1
inception_5b_1x1 1024 352 1
inception_5b_3x3_reduce 1024 192 1
inception_5b_3x3 192 320 3
inception_5b_double_3x3_reduce 1024 192 1
inception_5b_double_3x3_1 192 224 3
inception_5b_double_3x3_2 224 224 3
inception_5b_pool_proj 1024 128 1
"""


def reference_shapes() -> dict[str, tuple[int, ...]]:
    """The body's state_dict keys and shapes as the reference lays them out (without its classifier)."""
    table: dict[str, tuple[int, ...]] = {}
    for line in REFERENCE_CONVS.strip().splitlines():
        name, cin, cout, k = line.split()
        c_in, c_out, side = int(cin), int(cout), int(k)
        table[f"{name}.weight"] = (c_out, c_in, side, side)
        table[f"{name}.bias"] = (c_out,)
        for part in ("weight", "bias", "running_mean", "running_var"):
            table[f"{name}_bn.{part}"] = (c_out,)
        table[f"{name}_bn.num_batches_tracked"] = ()
    return table


def published_file(path: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """A file in the published layout: the reference keys, BatchNorm tensors as (1, C), the 1000-class
    ``last_linear``, no ``num_batches_tracked`` (the file predates it); random values."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in reference_shapes().items():
        if key.endswith("num_batches_tracked"):
            continue
        value = torch.rand(shape, generator=g) + 0.5
        state[key] = value.reshape(1, -1) if "_bn." in key else value
    state["last_linear.weight"] = torch.rand(1000, 1024, generator=g)
    state["last_linear.bias"] = torch.rand(1000, generator=g)
    torch.save(state, path)
    return state


def test_the_body_has_the_published_keys_and_shapes() -> None:
    assert layer_shapes() == reference_shapes()
    assert len(REFERENCE_CONVS.strip().splitlines()) == 69


def test_published_weights_load_key_for_key_and_the_classifier_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "bn_inception.pth"
    state = published_file(path)
    trunk = trunk_from("bninception", (3, 224, 224), 16, {}, pretrained=str(path))
    own = trunk.state_dict()
    assert torch.equal(own["body.conv1_7x7_s2.weight"], state["conv1_7x7_s2.weight"])
    assert torch.equal(
        own["body.inception_5b_pool_proj_bn.running_var"], state["inception_5b_pool_proj_bn.running_var"][0]
    )
    assert torch.equal(own["body.inception_3c_3x3_bn.weight"], state["inception_3c_3x3_bn.weight"].flatten())
    assert not any(k.startswith("body.last_linear") for k in own)
    # the same file under the published name is checked against its sha256 prefix: a different file is refused
    renamed = tmp_path / "bn_inception-52deb4733.pth"
    path.rename(renamed)
    with pytest.raises(BenchError, match=r"its name says 52deb4733\.\.\.: a damaged or different file"):
        trunk_from("bninception", (3, 224, 224), 16, {}, pretrained=str(renamed))


def test_a_file_of_another_layout_is_one_line_with_counts(tmp_path: Path) -> None:
    path = tmp_path / "other.pth"
    state = published_file(path)
    state["inception_4a_1x1.weight"] = torch.rand(224, 576, 3, 3)  # not a 1x1 convolution
    del state["inception_5b_1x1.bias"]
    torch.save(state, path)
    with pytest.raises(BenchError) as err:
        trunk_from("bninception", (3, 224, 224), 16, {}, pretrained=str(path))
    message = str(err.value)
    assert "\n" not in message and "1 missing key(s) (e.g. inception_5b_1x1.bias)" in message
    assert "inception_4a_1x1.weight: (224, 576, 3, 3) in the file, (224, 576, 1, 1) in the trunk" in message


def test_a_missing_weights_file_says_which_file_to_put_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(torch.hub, "_hub_dir", None)
    with pytest.raises(BenchError) as err:
        trunk_from("bninception", (3, 224, 224), 16, {}, pretrained="hub")
    where = hub_checkpoints() / "bn_inception-52deb4733.pth"
    assert str(err.value) == (
        "model.pretrained: bn_inception-52deb4733.pth not found: put Cadene's pretrainedmodels BN-Inception "
        "ImageNet weights (http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth) at "
        f"{where} or give a path"
    )
    with pytest.raises(BenchError, match="BN-Inception has one set of published weights: write hub, not hub:V2"):
        trunk_from("bninception", (3, 224, 224), 16, {}, pretrained="hub:V2")


@pytest.mark.parametrize("side", [224, 227, 64])
def test_random_weights_embed_with_the_head(side: int) -> None:
    torch.manual_seed(0)
    trunk = bninception((3, side, side), embedding_dim=24).eval()
    with torch.no_grad():
        features = trunk.body(torch.rand(2, 3, side, side))
        out = trunk(torch.rand(2, 3, side, side))
    assert features.shape == (2, 1024) and out.shape == (2, 24) and torch.isfinite(out).all()
    assert trunk.embed.in_features == 1024 and trunk.classifier == "last_linear"


def test_the_sides_it_takes_are_those_the_forward_pass_takes() -> None:
    body = BNInceptionBody().eval()
    with torch.device("meta"):
        body = body.to("meta")
        for side in range(31, 300):
            try:
                body(torch.empty(1, 3, side, side))
                fits = True
            except RuntimeError:
                fits = False
            assert fits == side_fits(side), side
    assert side_fits(224) and side_fits(227) and not side_fits(56)
    with pytest.raises(BenchError, match=r"input 56x56 does not fit trunk 'bninception'.*use 38 or 63 instead of 56"):
        bninception((3, 56, 56))
    with pytest.raises(BenchError, match="it needs at least 31x31"):
        bninception((3, 30, 30))


def test_bninception_input_is_bgr_on_the_255_scale_minus_the_mean() -> None:
    pipeline = build([{"BNInceptionInput": {}}], "eval")
    rgb = (200, 100, 50)
    out = pipeline(Image.new("RGB", (4, 3), rgb))
    assert out.shape == (3, 3, 4) and out.dtype == torch.float32
    expected = torch.tensor([50 - 104.0, 100 - 117.0, 200 - 128.0])  # B, G, R
    assert torch.allclose(out[:, 0, 0], expected, atol=1e-3)
    scaled = build([{"BNInceptionInput": {"mean": [0, 0, 0], "std": [2, 2, 2]}}], "eval")(Image.new("RGB", (2, 2), rgb))
    assert torch.allclose(scaled[:, 1, 1], torch.tensor([25.0, 50.0, 100.0]), atol=1e-3)
    with pytest.raises(
        BenchError, match=r"data\.augment\.eval\[0\]: BNInceptionInput\(mean=\[1, 2\]\) refused: mean must be 3"
    ):
        check({"eval": [{"BNInceptionInput": {"mean": [1, 2]}}]})
    with pytest.raises(BenchError, match="BNInceptionInput has no parameter 'scale'"):
        check({"eval": [{"BNInceptionInput": {"scale": 255}}]})
    with pytest.raises(BenchError, match=r"BNInceptionInput needs RGB images \(3, H, W\), got \(1, 2, 2\)"):
        build([{"BNInceptionInput": {}}], "eval")(Image.new("L", (2, 2), 7))


def test_a_proxy_loss_lr_is_its_own_parameter_group_and_moves_the_proxies() -> None:
    data = LabeledData(torch.randn(32, 6, generator=torch.Generator().manual_seed(0)), torch.arange(8).repeat(4), "v")
    base = dict(trunk="mlp", embedding_dim=4, loss="pml:proxy_nca", P=4, K=2, iterations=5, seed=0, lr=1e-3)
    config = TrainConfig(**base, loss_params={"lr": 0.5, "softmax_scale": 10.0})
    trunk, loss, _ = build_run(config, (6,), 8, torch.device("cpu"))
    groups = _optimizer(config, trunk, loss).param_groups
    assert [g["lr"] for g in groups] == [1e-3, 0.5]
    assert groups[1]["params"] == [loss.pml.proxies]
    plain = TrainConfig(**base, loss_params={"softmax_scale": 10.0})
    trunk, loss, _ = build_run(plain, (6,), 8, torch.device("cpu"))
    assert [g["lr"] for g in _optimizer(plain, trunk, loss).param_groups] == [1e-3]  # with the head, as before
    proxies = {}
    for lr in (1e-6, 2e-6, 0.5):
        result = train(TrainConfig(**base, loss_params={"lr": lr}), data)
        assert result.status == "ok"
        proxies[lr] = result.loss_module.pml.proxies.detach()
    assert float((proxies[0.5] - proxies[1e-6]).abs().max()) > 0.05  # the same initial proxies (seed 0)
    assert float((proxies[2e-6] - proxies[1e-6]).abs().max()) < 1e-4


def test_margin_learns_beta_per_class_at_its_own_lr() -> None:
    from bench import registry

    loss = registry.build_loss("pml:margin", {"num_classes": 5}, per_class=True, beta=0.9, margin=-0.02, lr=1e-3)
    assert loss.param_lr == 1e-3 and tuple(loss.pml.beta.shape) == (5,) and loss.pml.beta.requires_grad
    with pytest.raises(BenchError, match="lr is the learned beta's learning rate: set learn_beta"):
        registry.build_loss("pml:margin", {"num_classes": 5}, lr=1e-3)


# ---- the protocols ----------------------------------------------------------------------------------

# mlrc.md's optima, (CUB200, Cars196, SOP), by cell label and searched parameter ("miner." for the miner's);
# None where the paper gives N/A. The batch-256 column is another experiment (CUB at batch 256), not these
# protocols': its margin-per-class margin (-0.0204) is in the range anyway, its MS+miner beta too.
OPTIMA: dict[str, dict[str, tuple[float | None, ...]]] = {
    "contrastive": {"pos_margin": (-0.2000, 0.2652, 0.2850), "neg_margin": (0.3841, 0.5409, 0.5130)},
    "triplet": {"margin": (0.0961, 0.1190, 0.0451)},
    "infonce": {"temperature": (0.0091, 0.0219, 0.0002)},
    "pml-proxy_nca": {"lr": (6.04e-3, 4.43e-3, 5.28e-4), "softmax_scale": (13.98, 7.97, 10.73)},
    "pml-margin": {
        "lr": (1.31e-3, 1.11e-4, 1.82e-3),
        "margin": (0.0878, 0.0781, 0.0915),
        "beta": (0.7838, 1.3164, 1.1072),
    },
    "margin-per-class": {
        "lr": (2.65e-4, 4.76e-05, 7.10e-05),
        "margin": (0.0779, 0.0776, 0.0518),
        "beta": (0.9796, 0.9598, 0.8424),
    },
    "pml-normalized_softmax": {"lr": (4.46e-3, 1.10e-2, 5.46e-4), "temperature": (0.1087, 0.0886, 0.0630)},
    "pml-cosface": {
        "lr": (2.53e-3, 7.41e-3, 2.16e-3),
        "margin": (0.6182, 0.4324, 0.3364),
        "scale": (100.0, 161.5, 100.0),
    },
    "pml-arcface": {
        "lr": (5.13e-3, 7.39e-06, 2.01e-3),
        "margin": (23.22, 20.52, 18.63),
        "scale": (100.0, 49.50, 220.3),
    },
    "pml-fast_ap": {"num_bins": (17, 27, 16)},
    "pml-snr_contrastive": {
        "pos_margin": (0.3264, 0.1670, 0.3759),
        "neg_margin": (0.8446, 0.9337, 1.0831),
        "regularizer_weight": (0.1382, 0, 0),
    },
    "pml-multi_similarity": {"alpha": (0.01, 14.35, 8.49), "beta": (50.60, 75.83, 57.38), "base": (0.56, 0.66, 0.41)},
    "multi_similarity-with-miner": {
        "alpha": (17.97, 7.49, 15.94),
        "beta": (75.66, 47.99, 156.61),
        "base": (0.77, 0.63, 0.72),
        "miner.epsilon": (0.39, 0.72, 0.34),
    },
    "pml-soft_triple": {
        "lr": (5.37e-05, 1.40e-4, 8.68e-05),
        "la": (78.02, 17.69, 100.00),
        "gamma": (58.95, 19.18, 47.90),
        "reg_weight": (0.3754, 0.0669, None),
        "margin": (0.4307, 0.3588, 0.3145),
    },
}


@pytest.mark.parametrize("column, name", list(enumerate(PROTOCOLS)))
def test_each_search_space_contains_the_papers_optima(column: int, name: str) -> None:
    doc = load_protocol(REPO / "protocols" / f"{name}.yaml").doc
    assert doc["model"]["trunk"] == "bninception" and doc["model"]["pretrained"] == "hub"
    assert doc["tuning"]["trials"] == 50 and doc["data"]["validation"]["folds"] == 4
    assert "use" not in doc["data"]["validation"] or doc["data"]["validation"]["use"] == 4
    for side in ("train", "eval"):
        assert doc["data"]["augment"][side][-1] == {"BNInceptionInput": {"mean": [104, 117, 128], "std": [1, 1, 1]}}
    losses = {item["label"]: item for item in doc["grid"]["losses"]}
    assert sorted(losses) == sorted(OPTIMA)  # the paper's 14 methods, no more, no fewer
    miner = next(m for m in doc["grid"]["miners"] if m["name"] == "pml:multi_similarity")
    outside = []
    for label, optima in OPTIMA.items():
        for key, values in optima.items():
            value = values[column]
            if value is None:
                continue
            space = miner["search_space"] if key.startswith("miner.") else losses[label]["search_space"]
            dist = space[key.removeprefix("miner.")]
            if not dist["low"] <= value <= dist["high"]:
                outside.append(f"{label} {key}={value} not in [{dist['low']}, {dist['high']}]")
    assert outside == []


def test_every_searched_parameter_of_the_grid_is_live() -> None:
    """The probe sees a proxy loss's own lr and SoftTriple's regulariser weight (both act on the loss's own
    parameters, not on the embeddings' gradient): the shipped grid passes `validate`'s dead-parameter check."""
    found = plan(load_protocol(REPO / "protocols" / "reality-check-cub.yaml"))
    assert len(found.cells) == 14
    assert dead_parameters(found) == []


def test_a_proxy_loss_lr_searched_alone_is_live() -> None:
    """Searched alone, the lr changes no gradient at all: it is the proxies' step size, live because the
    proxies get a gradient (the probe before issue 24 refused it as dead)."""
    doc = yaml.safe_load((REPO / "protocols" / "reality-check-cub.yaml").read_text())
    space = {"lr": {"type": "float", "low": 1e-6, "high": 1.0, "log": True}}
    loss = {"name": "pml:proxy_nca", "miners": ["none"], "search_space": {**space, "softmax_scale": None}}
    doc["grid"]["losses"] = [loss]
    doc["grid"]["miners"] = [{"name": "none"}]
    found = plan(parse_protocol(yaml.safe_dump(doc)))
    assert [c.search_space for c in found.cells] == [{"loss.lr": {**space["lr"]}}]
    assert dead_parameters(found) == []


@pytest.mark.slow
def test_a_proxy_cell_of_the_tiny_cub_protocol_runs_end_to_end(tmp_path: Path) -> None:
    """The shipped ProxyNCA cell (its proxies' lr searched) through `dmlbench run` on the CUB fixture, at the
    field tests' tiny scale: BN-Inception from random weights at 64x64, BNInceptionInput, 2 iterations."""
    from datasets_fixtures import tiny, write_cub

    from bench.cli import main

    shipped = yaml.safe_load((REPO / "protocols" / "reality-check-cub.yaml").read_text())
    proxy = next(item for item in shipped["grid"]["losses"] if item["name"] == "pml:proxy_nca")
    doc = tiny(shipped)
    doc["grid"] = {"losses": [proxy], "miners": [{"name": "none"}]}
    assert doc["model"]["trunk"] == "bninception" and doc["data"]["image_size"] == 64
    write_cub(tmp_path / "data", classes=(1, 2, 3, 4, 101, 102, 103), per_class=4)
    protocol = tmp_path / "p.yaml"
    protocol.write_text(yaml.safe_dump(doc))
    results, runs = tmp_path / "results", tmp_path / "runs"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DMLBENCH_DATA", str(tmp_path / "data"))
        patch.chdir(tmp_path)
        args = ["--results-dir", str(results), "--storage", f"sqlite:///{runs / 'optuna.db'}"]
        args += ["--tracking-uri", str(runs / "mlflow.db"), "--threads", "1", "--quiet"]
        assert main(["run", str(protocol), *args]) == 0
    folder = results / doc["name"]
    assert main(["leaderboard", str(folder), "--quiet"]) == 0
    board = (folder / "leaderboard.md").read_text()
    # the shipped protocol's final mode, folds: the fold models concatenated and alone, both ranked
    assert "`pml-proxy_nca+none:concatenated` | 1 |" in board and "`pml-proxy_nca+none:separate` | 1 |" in board, board
    recorded = "\n".join(
        p.read_text(errors="replace") for p in folder.rglob("*") if p.suffix in (".json", ".md", ".csv")
    )
    assert "loss.lr" in recorded or '"lr"' in recorded  # the searched proxies' lr is among the recorded parameters
