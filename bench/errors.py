"""User-facing errors.

A `BenchError` is a mistake in what the user gave us (a name, a file, a
parameter). The command line prints it as one line and exits non-zero, with
no traceback; anything else that escapes is a bug and keeps its traceback.
"""


class BenchError(Exception):
    """A user error with a message fit to print on one line."""

    exit_code = 2


class DivergedError(BenchError):
    """Training produced a NaN or infinite loss; the runner records the trial as failed."""

    exit_code = 1

    def __init__(self, iteration: int, value: float):
        super().__init__(f"training diverged at iteration {iteration}: loss is {value}")
        self.iteration = iteration
        self.value = value
