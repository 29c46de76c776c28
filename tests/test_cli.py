"""The command line's conventions: help everywhere, one exit-code table, `--format`, one `--quiet`."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import click
import pandas as pd
import pytest
from _sweeps import CELLS, LOSSES, TINY, sweep, sweep_base, sweep_copy  # noqa: F401  (fixtures)

from bench import __version__, registry
from bench.cli import COMMANDS, cli, main
from bench.plan import plan
from bench.protocol import load_protocol

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "protocols" / "omniglot-smoke.yaml"
TABLE_COMMANDS = (
    "list",
    "plan",
    "regress",
    "claims",
    "run",
    "leaderboard",
    "crosscheck",
    "train",
    "variance",
    "power",
)


def _command(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, name
    return command


def test_python_m_bench_prints_help_with_the_exit_codes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--help"], cwd=REPO, text=True, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Exit status" in done.stdout and "130 interrupted" in done.stdout
    assert all(name in done.stdout for name in COMMANDS)
    version = subprocess.run(
        [sys.executable, "-m", "bench", "--version"], cwd=REPO, text=True, capture_output=True, timeout=120
    )
    assert version.stdout.strip() == f"dmlbench, version {__version__}"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_and_option_has_help(name: str) -> None:
    command = _command(name)
    assert command.help and command.help.strip(), name
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"{name} {param.opts}"
    names = {p.name for p in command.params}
    assert "quiet" in names, f"{name} has no --quiet"
    if name in TABLE_COMMANDS:
        fmt = next(p for p in command.params if p.name == "fmt")
        assert isinstance(fmt.type, click.Choice) and list(fmt.type.choices) == ["table", "csv", "json"]


def test_usage_errors_and_bad_input_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["no-such-command"]) == 2
    assert main(["list", "--format", "xml"]) == 2
    assert main(["plan", str(tmp_path / "absent.yaml")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("dmlbench: error:")
    assert main(["--help"]) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["no-such-command"],
        ["list", "--format", "xml"],
        ["run", str(SMOKE), "--threads", "0"],
        ["budget-check", str(SMOKE), "--shard", "a/b"],
        ["budget-check", str(SMOKE), "--multiple", "0"],
        ["plan", str(SMOKE), "--step-ms", "nan"],
        ["plan", str(SMOKE), "--step-ms", "inf"],
        ["plan", str(SMOKE), "--budget-check", "1.5"],
    ],
)
def test_a_usage_error_is_one_line_naming_the_help_to_read(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """click's own report is four lines (usage, hint, blank, error); every other refusal is one."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dmlbench: error: ") and lines[0].endswith("--help)"), lines
    assert captured.out == ""


def test_list_formats_carry_the_same_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--kind", "miner", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    miners = [e.name for e in registry.ENTRIES if e.kind == "miner"]
    assert [r["name"] for r in rows] == miners and {r["kind"] for r in rows} == {"miner"}
    assert main(["list", "--kind", "miner", "--format", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["name"] for r in table] == miners
    assert main(["list", "--kind", "miner"]) == 0
    text = capsys.readouterr().out
    assert all(f"miner  {m}" in text for m in miners)


def test_list_shows_each_methods_default_search_space(capsys: pytest.CaptureFixture[str]) -> None:
    """What a sweep tunes when a protocol does not say: the entry's search space, in every format."""
    assert main(["list", "--kind", "loss", "--format", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["triplet"]["search_space"] == registry.get("loss", "triplet").search_space
    assert rows["triplet"]["search_space"]["margin"]["log"] is True
    assert main(["list", "--kind", "miner", "--format", "csv"]) == 0
    table = {r["name"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert json.loads(table["semihard"]["search_space"]) == registry.get("miner", "semihard").search_space
    assert json.loads(table["batch_hard"]["search_space"]) == {}
    assert main(["list", "--kind", "loss"]) == 0
    text = capsys.readouterr().out
    triplet = text.split("loss   triplet(")[1].split("\nloss ")[0]
    assert "tunes by default: margin float [0.01, 1] log" in triplet


def test_plan_json_lists_planned_and_dropped_cells(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(SMOKE), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)
    p = plan(load_protocol(SMOKE))
    assert [r["cell"] for r in rows if r["status"] == "planned"] == [c.id for c in p.cells]
    assert [r["cell"] for r in rows if r["status"] == "dropped"] == [d.cell for d in p.dropped]
    assert all(r["iterations"] == p.budget.total_iterations for r in rows if r["status"] == "planned")
    assert err == ""


def test_leaderboard_formats_and_quiet(sweep_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["leaderboard", str(sweep_copy), "--format", "json", "--quiet"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert err == ""  # --quiet: no notice
    finals = pd.read_csv(sweep_copy / "finals.csv")
    means = finals.groupby("cell")["map_at_r"].mean().sort_values(ascending=False)
    assert [r["cell"] for r in doc["cells"]] == list(means.index)
    assert [r["map_at_r"] for r in doc["cells"]] == pytest.approx(list(means.values))
    assert doc["protocol_hash"] == json.loads((sweep_copy / "manifest.json").read_text())["protocol_hash"]

    assert main(["leaderboard", str(sweep_copy), "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    table = pd.read_csv(io.StringIO(out))
    assert list(table["cell"]) == list(means.index) and sorted(table["cell"]) == sorted(CELLS)
    assert err.startswith("wrote ")  # without --quiet the notice goes to stderr, never into the table


def test_leaderboard_table_is_the_aligned_table_run_prints(
    sweep_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`leaderboard --format table` prints `run`'s aligned terminal table, not the Markdown it writes to a file."""
    from bench.commands.leaderboard import table
    from bench.reports import leaderboard, source

    assert main(["leaderboard", str(sweep_copy), "--format", "table", "--quiet"]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    res = source.load(sweep_copy)
    assert out == table(leaderboard.build(res), res)
    assert "|" not in out and not out.startswith("## ")  # no Markdown
    head = next(line for line in out.splitlines() if line.lstrip().startswith("rank"))
    rule = out.splitlines()[out.splitlines().index(head) + 1]
    assert set(rule.replace(" ", "")) == {"-"} and len(rule) == len(head)  # aligned columns under a rule
    assert all(cell in out for cell in CELLS)
    md = (sweep_copy / "leaderboard.md").read_text()
    assert md.startswith("## dmlbench leaderboard") and "| rank |" in md  # the file keeps the Markdown


def test_regress_json_is_the_report_and_exit_code_comes_back(
    sweep: Path, sweep_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["regress", "--baseline", str(sweep), "--current", str(sweep_copy), "--format", "json", "-q"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["exit_code"] == 0 and {c["status"] for c in doc["cells"]} == {"same"} and err == ""
    finals = pd.read_csv(sweep_copy / "finals.csv")
    finals[finals["cell"] != CELLS[1]].to_csv(sweep_copy / "finals.csv", index=False)
    assert main(["regress", "--baseline", str(sweep), "--current", str(sweep_copy), "--format", "csv"]) == 1
    rows = {r["cell"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert rows[CELLS[1]]["status"] == "missing" and rows[CELLS[1]]["current_mean"] == ""
    assert {r["status"] for c, r in rows.items() if c != CELLS[1]} == {"same"}


def _running_trials(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return con.execute("select count(*) from trials where state = 'RUNNING'").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_sigterm_during_run_exits_130(tmp_path: Path, data_root: Path) -> None:
    proto = tmp_path / "long.yaml"
    proto.write_text(TINY.format(name="long", iterations=100000, losses=LOSSES))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench",
            "run",
            str(proto),
            "--results-dir",
            str(tmp_path / "results"),
            "--data-root",
            str(data_root),
            "--storage",
            f"sqlite:///{tmp_path / 'optuna.db'}",
            "--tracking-uri",
            str(tmp_path / "mlflow.db"),
            "--quiet",
        ],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and worker.poll() is None and not _running_trials(tmp_path / "optuna.db"):
        time.sleep(0.1)
    assert worker.poll() is None, worker.communicate()
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 130, err
    assert err.strip().splitlines()[-1] == "dmlbench: interrupted"


def test_an_interrupt_lost_in_a_callback_still_ends_the_work_as_interrupted(monkeypatch) -> None:
    """Ctrl-C landing in a weakref callback: Python swallows the KeyboardInterrupt there and goes on, so the
    work inside `stop_on_signals` must still end as interrupted (exit 130 for `run`, not a sweep that went on
    to exit 0), a new claim must not begin, and Python's "Exception ignored" notice must not reach stderr."""
    import weakref

    from bench.sweep.accounts import STOP, Accounts, stop_on_signals

    class Thing:
        pass

    def callback(_: object) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler runs here, inside the callback, and its KeyboardInterrupt is lost

    before = signal.getsignal(signal.SIGINT)
    unraisable: list[object] = []  # what Python would print as "Exception ignored in: ..."
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    went_on = False
    with pytest.raises(KeyboardInterrupt):
        with stop_on_signals():
            thing = Thing()
            ref = weakref.ref(thing, callback)
            del thing
            went_on = ref() is None and STOP.is_set()  # the lost interrupt: the code went on, the flag is set
            with pytest.raises(KeyboardInterrupt):
                Accounts._claim(None, None)  # type: ignore[arg-type]  # refused before touching anything
    assert went_on and unraisable == []
    assert signal.getsignal(signal.SIGINT) is before  # restored
    with stop_on_signals():  # a later command starts with the flag down
        assert not STOP.is_set()


def test_a_refused_run_leaves_no_results_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "new" / "results"
    assert main(["run", str(SMOKE), "--results-dir", str(results), "--data-root", str(tmp_path / "nowhere")]) == 2
    assert "omniglot not found" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("")
    assert main(["run", str(SMOKE), "--results-dir", str(tmp_path / "file" / "results")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"dmlbench: error: --results-dir {tmp_path / 'file' / 'results'}: {tmp_path / 'file'} is a file, not a folder"
    )
