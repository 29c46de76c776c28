"""The bad-input corpus (issue 12): every hostile or malformed input ends cleanly.

Each file under `tests/bad_inputs/` is one case (format in its first lines
and in the case files themselves): the files it writes under a fresh
{tmp}, the `dmlbench` arguments, the exit code and the words the error
must contain. A case passes when the command returns that code within its
timeout, prints no traceback, prints exactly one ``dmlbench: error:`` line
for exit 2, and leaves {tmp} byte-identical unless the case says it
writes. Cases run in process (``bench.cli.main``) so 150+ of them stay
fast; ``subprocess: true`` runs ``python -m bench`` for hangs and signals.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "bad_inputs"
CASES = sorted(CORPUS.glob("*.yaml"))
KEYS = {
    "what",
    "argv",
    "files",
    "files_b64",
    "copy",
    "exit",
    "stderr",
    "stdout",
    "writes",
    "timeout",
    "subprocess",
    "env",
    "file_lacks",
}


def _data_root() -> str:
    """The shared data folder `bench.data` finds from the repository (the cases run in {tmp}, so named here)."""
    return str((REPO / ".." / "shared" / "data").resolve())


def _substitute(value: str, tmp: Path) -> str:
    return value.replace("{tmp}", str(tmp)).replace("{repo}", str(REPO)).replace("{data}", _data_root())


def _snapshot(root: Path) -> dict[str, str]:
    """Relative path -> content hash (or mode for folders) of everything under root, symlinks not followed."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _prepare(case: dict[str, Any], tmp: Path) -> None:
    for name, source in (case.get("copy") or {}).items():
        src = REPO / source
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, tmp / name)
    for name, text in (case.get("files") or {}).items():
        target = tmp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_substitute(text, tmp), encoding="utf-8")
    for name, data in (case.get("files_b64") or {}).items():
        target = tmp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(data))


def _run_in_process(argv: list[str], timeout: float, env: dict[str, str]) -> tuple[int | None, str, str]:
    """`bench.cli.main(argv)` in a thread with stdout/stderr captured; None as the code on a timeout."""
    from bench.cli import main

    out, err = io.StringIO(), io.StringIO()
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["code"] = main(argv)
        except SystemExit as e:  # click may exit on --help and the like
            result["code"] = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001  (a bug: shown as a traceback, which the case then fails on)
            import traceback

            result["code"] = 1
            err.write(traceback.format_exc())

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        # a warning goes to stderr as the command line would print it: a bad input's one line must stand alone
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("default")
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            thread.join(timeout)
        for w in caught:
            err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return (None if thread.is_alive() else result.get("code")), out.getvalue(), err.getvalue()


def _run_subprocess(argv: list[str], timeout: float, env: dict[str, str], cwd: Path) -> tuple[int | None, str, str]:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bench", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
        )
    except subprocess.TimeoutExpired as e:
        return None, str(e.stdout or ""), str(e.stderr or "")
    return done.returncode, done.stdout, done.stderr


def test_corpus_is_well_formed() -> None:
    assert len(CASES) >= 90
    for path in CASES:
        case = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert isinstance(case, dict) and set(case) <= KEYS, f"{path.name}: unknown keys {set(case) - KEYS}"
        assert isinstance(case.get("what"), str) and "\n" not in case["what"].strip(), path.name
        assert isinstance(case.get("argv"), list) and isinstance(case.get("exit"), int), path.name


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_bad_input(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = yaml.safe_load(path.read_text(encoding="utf-8"))
    tmp = tmp_path / "case"
    tmp.mkdir()
    _prepare(case, tmp)
    monkeypatch.chdir(tmp)  # a command that writes to a default relative folder writes where the snapshot sees it
    argv = [_substitute(str(a), tmp) for a in case["argv"]]
    env = {k: _substitute(str(v), tmp) for k, v in (case.get("env") or {}).items()}
    timeout = float(case.get("timeout", 20))
    before = _snapshot(tmp)
    code, out, err = (
        _run_subprocess(argv, timeout, env, tmp) if case.get("subprocess") else _run_in_process(argv, timeout, env)
    )
    try:
        assert code is not None, f"{case['what']}: no answer within {timeout:.0f} s (a hang)"
        both = out + err
        assert "Traceback" not in both, f"{case['what']}: traceback\n{both[-3000:]}"
        assert code == case["exit"], f"{case['what']}: exit {code}, expected {case['exit']}\n{both[-2000:]}"
        if case["exit"] == 2:
            errors = [line for line in err.splitlines() if line.startswith("dmlbench: error:")]
            usage = [line for line in err.splitlines() if line.startswith("Error:")]  # click's usage errors
            assert len(errors) + len(usage) == 1, f"{case['what']}: expected one error line\n{err[-2000:]}"
            warned = [line for line in err.splitlines() if "Warning: " in line]
            assert not warned, f"{case['what']}: a warning beside the error line\n{err[-2000:]}"
        low_err = err.lower()
        for word in case.get("stderr") or []:
            assert str(word).lower() in low_err, f"{case['what']}: {word!r} not in stderr\n{err[-2000:]}"
        for word in case.get("stdout") or []:
            assert str(word).lower() in out.lower(), f"{case['what']}: {word!r} not in stdout\n{out[-2000:]}"
        if not case.get("writes", False):
            after = _snapshot(tmp)
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            assert not changed, f"{case['what']}: changed under {{tmp}}: {changed[:10]}"
        for name, words in (case.get("file_lacks") or {}).items():
            text = (tmp / name).read_text(encoding="utf-8")
            for word in words:
                assert word not in text, f"{case['what']}: {word!r} found raw in {name}"
        outside = tmp_path / "outside"
        assert not outside.exists(), f"{case['what']}: wrote outside its folder: {outside}"
    finally:
        for p in tmp.rglob("*"):  # a read-only case leaves folders pytest could not remove
            with contextlib.suppress(OSError):
                p.chmod(0o700 if p.is_dir() else 0o600)


TINY = """name: tiny
seed: 0
data: {train: "omniglot:background", test: "omniglot:evaluation", train_classes: 24, test_classes: 12,
       image_size: 20, validation: {folds: 4, use: 1}}
model: {trunk: conv4, embedding_dim: 32, normalize: true}
training: {optimizer: adam, lr: 1.0e-3, P: 8, K: 4, iterations: 40}
evaluation: {metrics: [precision_at_1, map_at_r], primary: map_at_r}
tuning: {trials: 2, pruner: {type: none}}
final: {seeds: 2}
grid: {losses: [{name: triplet, miners: [none]}], miners: [{name: none}]}
"""


def test_mlflow_cell_tag_never_becomes_a_path(tmp_path: Path) -> None:
    """A run tagged ``cell: ../../outside`` in a real MLflow store: its artifacts are not written outside --out."""
    import numpy as np
    from mlflow.tracking import MlflowClient

    from bench.plan import plan as make_plan
    from bench.protocol import parse_protocol
    from bench.reports import mlflow_source

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("x", artifact_location=str(tmp_path / "store"))
    np.savez(tmp_path / "pair_distances.npz", pos=np.zeros(3), neg=np.ones(3))
    runs = []
    for cell in ("../../outside", "/abs", "triplet+none"):
        run = client.create_run(experiment, tags={"kind": "final", "seed": "0", "cell": cell})
        client.log_artifact(run.info.run_id, str(tmp_path / "pair_distances.npz"))
        runs.append(client.get_run(run.info.run_id))
    out = tmp_path / "a" / "b" / "out"
    mlflow_source._download(client, runs, out, make_plan(parse_protocol(TINY)))
    written = sorted(
        str(p.relative_to(tmp_path)) for p in tmp_path.rglob("pair_distances.npz") if "store" not in p.parts
    )
    assert written == ["a/b/out/artifacts/triplet+none/pair_distances.npz", "pair_distances.npz"]


def test_markdown_code_span_cannot_be_closed_by_its_text() -> None:
    from bench.reports.escape import md_code, md_text

    span = md_code("t`<img src=x onerror=alert(1)>`|x\ny")
    fence = span.split(" ", 1)[0]
    assert fence == "``" and span.endswith(" ``") and span.count("``") == 2  # one run of 1 inside, fenced by 2
    assert "\n" not in span and "\\|" in span
    assert md_code("triplet+none") == "`triplet+none`"  # ordinary names are unchanged
    assert md_text("<script>a|b`c</script>\nd") == "&lt;script&gt;a\\|b`c&lt;/script&gt; d"


def test_a_listening_http_server_is_reachable_and_a_closed_port_is_one_line() -> None:
    """The pre-flight check must not refuse a server that answers, whatever it answers (here 404)."""
    import http.server

    from bench.errors import BenchError
    from bench.stores.tracking import check_reachable

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        check_reachable(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(BenchError, match="cannot reach MLflow tracking server"):
        check_reachable(f"http://127.0.0.1:{server.server_port}/closed")
