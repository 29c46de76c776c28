"""One module a command, each exporting a click `command`; `bench.cli` imports one only when it runs."""

__all__: list[str] = []
