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


class MethodError(BenchError):
    """A loss or miner raised while training (its forward, ``bind_loss``, a dataset-level miner's batch): the
    method's failure, not the harness's, so the runner records the trial or final seed as failed with this
    one line, as it does a `DivergedError`. ``iteration``: the step it raised in (1-based; 0 before the first).
    """

    exit_code = 1

    def __init__(self, role: str, name: str, iteration: int, error: BaseException, where: str = ""):
        lines = str(error).strip().splitlines()
        message = lines[0][:300] if lines else ""
        super().__init__(
            f"{role} {name}{f' ({where})' if where else ''} raised {type(error).__name__}"
            + (f": {message}" if message else "")
        )
        self.role, self.name, self.iteration, self.error = role, name, iteration, error
