"""What a final seed leaves a user to reuse: its trained model and its test embeddings, as MLflow artifacts.

Under ``final.keep_models`` (true when absent) every completed final seed of a
sweep attaches two files to its MLflow run:

* ``final_model.pt``: the trunk's state dict (under ``final.mode: folds`` the
  fold models joined, `bench.evaluation.Concatenated`), the state dict of
  each model's loss where it has parameters of its own (proxies, a learned
  metric, a learned beta), and what rebuilds the trunk (its registry name,
  parameters, embedding size, input shape). Tensors, numbers and text only,
  so ``torch.load(..., weights_only=True)`` reads it.
* ``test_embeddings.npz``: the test set's embeddings in the geometry every
  metric used (L2-normalised when the protocol normalises) and their labels,
  ``x`` and ``y``; a query/gallery test set as ``query_x``, ``query_y``,
  ``gallery_x``, ``gallery_y``.

`load_final(tracking_uri, protocol, cell, seed)` reads them back: the model
rebuilt and loaded, the losses' state dicts, the embeddings. `kept_bytes` is
what `plan` prints as their size.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.atomic import write_npz
from bench.errors import BenchError
from bench.plan import Cell, plan
from bench.plan.types import cell_key
from bench.protocol import Protocol, load_protocol
from bench.stores.tracking import check_reachable, resolve_tracking_uri, search_all
from bench.stores.urls import sqlite_path

__all__ = ["EMBEDDINGS_FILE", "MODEL_FILE", "FinalModel", "kept_bytes", "load_final", "write_final"]

MODEL_FILE = "final_model.pt"
EMBEDDINGS_FILE = "test_embeddings.npz"
FORMAT = 1  # the layout of final_model.pt; another is refused by load_final


def write_final(
    directory: Path,
    protocol: Protocol,
    prepared: Any,
    cell: Cell,
    params: dict[str, Any],
    seed: int,
    model: Any,
    losses: list[Any],
) -> list[Path]:
    """Write a final seed's model (``model``, the losses of its parts ``losses``) and its test embeddings into
    ``directory``; returns the two files."""
    import numpy as np
    import torch

    from bench.data.query_gallery import QueryGallery
    from bench.evaluation import embed

    m = protocol.spec.model
    state = {
        "format": FORMAT,
        "protocol": protocol.name,
        "protocol_hash": protocol.hash,
        "cell": cell.id,
        "seed": seed,
        "params": {k: v for k, v in params.items() if isinstance(v, (int, float, str, bool))},
        "trunk": m.trunk,
        "trunk_params": dict(m.trunk_params),
        "embedding_dim": m.embedding_dim,
        "in_shape": [int(s) for s in prepared.train.x.shape[1:]],
        "parts": len(losses) if len(losses) > 1 else 0,  # fold models joined; 0: one trunk
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "losses": [_own_state(loss) for loss in losses],
    }
    written = [directory / MODEL_FILE, directory / EMBEDDINGS_FILE]
    torch.save(state, written[0])
    device, normalize = protocol.spec.training.device, m.normalize
    test = prepared.test
    if isinstance(test, QueryGallery):
        arrays = {
            f"{side}_{k}": v
            for side, data in (("query", test.query), ("gallery", test.gallery))
            for k, v in (("x", embed(model, data.x, device=device, normalize=normalize).numpy()), ("y", data.y.numpy()))
        }
    else:
        arrays = {"x": embed(model, test.x, device=device, normalize=normalize).numpy(), "y": test.y.numpy()}
    write_npz(written[1], **{k: np.ascontiguousarray(v) for k, v in arrays.items()})
    return written


def _own_state(loss: Any) -> dict[str, Any] | None:
    """A loss's own parameters and buffers as a CPU state dict, or None when it has none."""
    import torch

    if not isinstance(loss, torch.nn.Module):
        return None
    state = {k: v.detach().cpu() for k, v in loss.state_dict().items()}
    return state or None


@dataclass
class FinalModel:
    """A final seed read back: ``model`` (eval mode, CPU), each part's loss parameters (``losses``, None where
    the loss has none), the test ``embeddings`` as written, and where they came from."""

    model: Any
    losses: list[dict[str, Any] | None]
    embeddings: dict[str, Any]
    run_id: str
    info: dict[str, Any] = field(default_factory=dict)  # protocol, hash, cell, seed, params, trunk


def load_final(
    tracking_uri: str | Path, protocol: str | Path | Protocol, cell: str, seed: int, draw: int = 0
) -> FinalModel:
    """Final seed ``seed`` of ``cell`` of ``protocol`` (a file or a loaded `Protocol`), as a sweep recorded it
    in the MLflow store ``tracking_uri`` (a URI, or a path as ``run --tracking-uri`` takes it) under
    ``final.keep_models``: the model rebuilt with its trained
    weights, its losses' parameters and its test embeddings. ``draw``: the tuning draw (``tuning.repeats``).

    The run is found by the cell's key under this protocol (its settings and the cell's definition; another
    version of the protocol is another key); when the store holds the cell on several versions of the data,
    the newest finished run is read, and ``info["key"]`` says which. Anything missing is one BenchError."""
    import numpy as np
    import torch

    from bench.evaluation import Concatenated
    from bench.trunks import trunk_from

    p = protocol if isinstance(protocol, Protocol) else load_protocol(protocol)
    try:
        planned = plan(p).cell(cell)
    except KeyError:
        raise BenchError(f"load_final: {p.name} has no cell {cell!r}") from None
    if seed not in p.final_seeds:
        raise BenchError(f"load_final: {p.name}'s final seeds are {', '.join(map(str, p.final_seeds))}, not {seed}")
    uri = resolve_tracking_uri(tracking_uri, create=False)  # a path, as `run --tracking-uri` takes it, or a URI
    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise BenchError(f"load_final: no MLflow store at {tracking_uri}")
    check_reachable(uri)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(f"dmlbench/{p.name}")
    if experiment is None:
        raise BenchError(f"load_final: {tracking_uri} holds no run of protocol {p.name}")
    head = cell_key(p, planned)  # the cell's key without the data's part
    suffix = f"/{cell}/{f'draw{draw}-' if draw else ''}seed{seed}"
    runs = [
        r
        for r in search_all(client, experiment.experiment_id, f"tags.`dmlbench.key` LIKE '{head}%'")
        if r.data.tags.get("dmlbench.key", "").endswith(suffix) and r.info.status == "FINISHED"
    ]
    if not runs:
        raise BenchError(
            f"load_final: no finished final seed {seed} of {cell} under {p.name}@{p.hash12} in {tracking_uri} "
            "(not run yet, or run under another version of the protocol)"
        )
    run = max(runs, key=lambda r: (r.info.start_time, r.info.run_id))
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    if not {MODEL_FILE, EMBEDDINGS_FILE} <= names:
        raise BenchError(
            f"load_final: final seed {seed} of {cell} kept no model (its run {run.info.run_id} has no "
            f"{MODEL_FILE}: the protocol had final.keep_models: false, the seed failed, or its stores were restored "
            "from a checkpoint, which leaves kept models out)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        state = torch.load(client.download_artifacts(run.info.run_id, MODEL_FILE, tmp), weights_only=True)
        with np.load(client.download_artifacts(run.info.run_id, EMBEDDINGS_FILE, tmp), allow_pickle=False) as z:
            embeddings = {k: z[k] for k in z.files}
    if state.get("format") != FORMAT:
        raise BenchError(f"load_final: {MODEL_FILE} of run {run.info.run_id} is format {state.get('format')!r}")
    shape = tuple(state["in_shape"])

    def trunk() -> Any:
        return trunk_from(state["trunk"], shape, state["embedding_dim"], dict(state["trunk_params"]))

    model = Concatenated([trunk() for _ in range(state["parts"])]) if state["parts"] else trunk()
    model.load_state_dict(state["model"])
    model.eval()
    info = {k: state[k] for k in ("protocol", "protocol_hash", "cell", "seed", "params", "trunk", "in_shape")}
    info["key"] = run.data.tags["dmlbench.key"]
    return FinalModel(model, list(state["losses"]), embeddings, run.info.run_id, info)


def kept_bytes(protocol: Protocol, test_images: float) -> tuple[int, int]:
    """Bytes one final seed keeps: its model's float32 weights (every fold model under ``final.mode: folds``;
    a loss's own parameters not counted) and its test embeddings (float32, int64 labels) for ``test_images``
    test images. The trunk is built here on one input channel (the first layer's count barely depends on it)."""
    from bench.trunks import trunk_from

    spec = protocol.spec
    h, w = spec.data.hw
    m = spec.model
    channels = spec.data.channels or 1
    net = trunk_from(m.trunk, (channels, h, w), m.embedding_dim, dict(m.trunk_params))
    weights = sum(t.numel() for t in net.state_dict().values()) * 4
    parts = spec.data.validation.use if spec.final.mode == "folds" else 1
    embeddings = int(test_images) * (m.embedding_dim * parts * 4 + 8)
    return weights * parts, embeddings
