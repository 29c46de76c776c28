"""What a sweep shows while it runs: bars on a terminal, plain lines anywhere else.

On a terminal, three tqdm bars on stderr: cells, the runs of the current cell (trials x
folds, then final seeds), and iterations over the whole sweep (allotted: a run that stops
early spends its allotment). A resumed sweep starts the iteration bar at what is already
recorded. The time left in the plain lines is paced by the iterations trained since this
process started, times what the unfinished runs are expected to train (under early
stopping much less than their allotment: `bench.sweep.accounts.Expected`).
When stderr is not a terminal (a log file, CI, `| tee`) bars would be
escape-code noise, so there are none: one line per finished trial or final
run, ending with the share of the sweep's iterations done and the time
left, and a progress line every `EVERY_S` seconds during a long run. With
``quiet`` there are the per-run lines alone. Workers sharing a storage each report
the store's count after every finished run (``recorded``), so the share and
the pace are the whole sweep's, not this process's alone: a worker whose
partner did half the work would otherwise see 50% at the end.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from bench.clock import hms

EVERY_S = 60.0  # a progress line this often during a run, where there are no bars


def is_terminal(stream: IO[str]) -> bool:
    """Whether ``stream`` is an interactive terminal (bars redraw there; anywhere else they are noise)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or exotic stream
        return False


class Progress:
    """The bars (or quiet lines) of one worker's sweep."""

    def __init__(
        self,
        n_cells: int,
        total_iterations: int,
        done_iterations: int = 0,
        quiet: bool = False,
        stream: IO[str] | None = None,
    ) -> None:
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.bars = not quiet and is_terminal(self.stream)
        self.start = self._last_line = time.monotonic()
        self._run_total = 0
        self._run_done = 0
        self.total = total_iterations
        self.done = self._done_at_start = done_iterations
        # iterations trained (the store's, from the first `recorded` that gives them) and those expected to
        # be left, for the pace where runs stop before their allotment; this run's so far, not yet recorded
        self._trained_at_start: int | None = None
        self._trained = self._left = self._run_trained = 0
        # iterations an earlier attempt trained of the runs this process went on from (`resumed`): done, but
        # not by this process, so outside its pace
        self._resumed = 0
        self.cells = self.runs = self.iterations = None
        if self.bars:
            from tqdm import tqdm

            self.cells = tqdm(total=n_cells, desc="cells", unit="cell", file=self.stream, position=0)
            self.runs = tqdm(total=0, desc="runs", unit="run", file=self.stream, position=1, leave=False)
            self.iterations = tqdm(
                total=total_iterations,
                initial=done_iterations,
                desc="iterations",
                unit="it",
                file=self.stream,
                position=2,
                smoothing=0.05,
            )

    # ---- cells and runs

    def cell(self, cell_id: str, runs_total: int, runs_done: int) -> None:
        """A cell begins: the runs bar restarts at ``runs_done`` of ``runs_total`` (a resumed cell keeps its
        count)."""
        if self.runs is not None:
            self.runs.reset(total=runs_total)
            self.runs.update(runs_done)
            self.runs.set_description(cell_id)

    def cell_done(self, n: int = 1) -> None:
        """``n`` cells finished (more than one when a resume skips finished cells)."""
        if self.cells is not None:
            self.cells.update(n)

    def run_started(self, iterations: int) -> None:
        """A training run of ``iterations`` begins: ``iteration`` calls count into it, ``run_finished``
        settles the rest."""
        self._run_total, self._run_done, self._run_trained = iterations, 0, 0

    def _advance(self, n: int) -> None:
        if n > 0:
            self.done += n
            if self.iterations is not None:
                self.iterations.update(n)

    def iteration(self, it: int, total: int, loss: float) -> None:
        """The training loop's progress callback: advance the sweep's iteration count."""
        if it > self._run_done:
            self._advance(it - self._run_done)
            self._run_done = self._run_trained = it
            if self.iterations is not None:
                self.iterations.set_postfix(loss=f"{loss:.4f}", refresh=False)
            elif not self.quiet and time.monotonic() - self._last_line >= EVERY_S:
                self.line(f"iteration {it}/{total} of this run, loss {loss:.4f} | {self.eta()}")

    def resumed(self, it: int) -> None:
        """The running run goes on from a saved state at iteration ``it`` (`bench.resume.RunState`): its
        first ``it`` iterations count as done, not as trained at this process's pace."""
        self._resumed += it

    def run_finished(self) -> None:
        """Count the rest of a run's allotment (pruned or diverged early) so the time left stays right."""
        self._advance(self._run_total - self._run_done)
        self._run_done = self._run_total
        if self.runs is not None:
            self.runs.update(1)

    def skip(self, iterations: int) -> None:
        """Folds a failed or pruned trial never started still count as spent, for the time left."""
        self._advance(iterations)

    def recorded(self, iterations: int, trained: int | None = None, left: int | None = None) -> None:
        """The iterations the storage holds as spent, by every worker: the count moves up to it (never down,
        since this process's running run is not in the store yet). With ``trained`` (what the recorded runs
        trained) and ``left`` (what the others are expected to train: `bench.sweep.accounts.Expected`), the
        time left is paced by trained iterations: runs that stop early spend less than their allotment."""
        self._advance(iterations - self.done)
        if trained is not None and left is not None:
            if self._trained_at_start is None:
                self._trained_at_start = self._trained = trained
            self._trained = max(self._trained, trained)
            self._left, self._run_trained = left, 0

    def eta(self) -> str:
        """`37% of iterations, ~0:21:05 left`, at the pace of what was trained since this process started
        (other workers' runs included once ``recorded`` has seen them); the share is of the allotted
        iterations. Without the store's trained counts, paced by allotted iterations."""
        pct = 100 * self.done / self.total if self.total else 100.0
        if self._trained_at_start is not None:
            ran, left_it = self._trained - self._trained_at_start + self._run_trained, self._left - self._run_trained
        else:
            ran, left_it = self.done - self._done_at_start, self.total - self.done
        ran -= self._resumed  # a resumed run's earlier iterations, in the counts above but not trained here
        if ran <= 0:
            return f"{pct:.0f}% of iterations"
        left = (time.monotonic() - self.start) / ran * max(left_it, 0)
        return f"{pct:.0f}% of iterations, ~{hms(left)} left"

    # ---- lines

    def trial(
        self,
        cell: str,
        slot: int,
        n: int,
        state: str,
        value: float | None,
        metric: str,
        iterations: int,
        wall_s: float,
        reason: str = "",
    ) -> None:
        """One line for a finished trial ``slot`` of ``n``: state, score, cost, and why when it did not complete."""
        score = f" {metric}={value:.4f}" if value is not None else ""
        why = f" ({reason})" if reason and state != "COMPLETE" else ""
        self.line(f"{cell} trial {slot + 1}/{n} {state}{score} [{iterations} it, {wall_s:.1f} s]{why} | {self.eta()}")

    def final(
        self, cell: str, seed: int, state: str, metrics: dict[str, Any], metric: str, wall_s: float, reason: str = ""
    ) -> None:
        """One line for a finished final seed: state, primary score, wall time, and why when it did not complete."""
        score = f" {metric}={metrics[metric]:.4f}" if metric in metrics else ""
        why = f" ({reason})" if reason and state != "COMPLETE" else ""
        self.line(f"{cell} final seed {seed} {state}{score} [{wall_s:.1f} s]{why} | {self.eta()}")

    def line(self, text: str) -> None:
        """A timestamped line that does not break the bars (plain lines where there are none)."""
        self._last_line = time.monotonic()
        stamp = f"[{hms(self._last_line - self.start)}]"
        if not self.bars:
            print(f"{stamp} {text}", file=self.stream, flush=True)
        else:
            from tqdm import tqdm

            tqdm.write(f"{stamp} {text}", file=self.stream)

    def close(self) -> None:
        """Close the bars, so the terminal is left clean."""
        for bar in (self.iterations, self.runs, self.cells):
            if bar is not None:
                bar.close()
