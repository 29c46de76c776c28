"""The documentation's examples run: its protocols validate, its claims files parse, its command lines name
real options.

A new user copies these first; an example that the code refuses (a miner
missing from `grid.miners`, an option renamed since) is the first thing
they meet, so the tests read the examples from the text itself (the README,
the site's pages under docs/ and benchmarks/README.md) rather than from a
copy that could drift.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from bench.cli import cli
from bench.reports import claims

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "benchmarks" / "README.md"]
README = "\n".join(page.read_text() for page in PAGES)  # every page a reader may copy from, as one text
FENCE = r"^[ \t]*```"  # a fence may be indented inside a list item
BLOCKS = re.findall(FENCE + r"(\w*)\n(.*?)" + FENCE, README, flags=re.S | re.M)


def _yaml_blocks(*keys: str) -> list[str]:
    """The README's YAML blocks whose top level holds every key of ``keys``."""
    found = []
    for lang, body in BLOCKS:
        if lang != "yaml":
            continue
        doc = yaml.safe_load(body)
        if isinstance(doc, dict) and all(k in doc for k in keys):
            found.append(body)
    return found


PROTOCOLS = _yaml_blocks("name", "data", "grid")
CLAIMS = _yaml_blocks("protocol", "claims")


def test_the_readme_shows_protocols_and_claims() -> None:
    """The scans below see the examples (a changed fence would otherwise leave them testing nothing), and the
    README itself shows a whole protocol and the command lines a new user starts with."""
    assert len(PROTOCOLS) >= 4 and len(CLAIMS) >= 1
    readme = PAGES[0].read_text()
    assert any(body in readme for body in PROTOCOLS)
    assert "dmlbench run protocols/omniglot-quick.yaml --redo" in readme


@pytest.mark.parametrize("body", PROTOCOLS, ids=lambda b: yaml.safe_load(b)["name"])
def test_readme_protocols_validate(body: str, tmp_path: Path) -> None:
    """Each full protocol in the docs passes `validate --no-data`; one naming plugin entries gets the
    README's plugin (the file it tells the reader to copy), in a process of its own so the registry of
    this test process stays clean."""
    path = tmp_path / "p.yaml"
    path.write_text(body)
    plugin = ["--plugin", str(REPO / "tests" / "plugin_pkg" / "my_methods.py")] if "file_" in body else []
    done = subprocess.run(
        [sys.executable, "-m", "bench", *plugin, "validate", str(path), "--no-data", "-q"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("body", CLAIMS, ids=lambda b: yaml.safe_load(b)["protocol"])
def test_readme_claims_parse(body: str, tmp_path: Path) -> None:
    """The claims example is a valid claims file, each claim with a known kind and its fields."""
    path = tmp_path / "c.yaml"
    path.write_text(body)
    parsed = claims.parse(path)
    assert [c["id"] for c in parsed.claims] == [c["id"] for c in yaml.safe_load(body)["claims"]]


def _command_lines() -> list[str]:
    """Every `dmlbench ...` invocation the docs show: lines of code blocks and inline code spans."""
    lines = [
        ln.strip()
        for lang, body in BLOCKS
        if lang not in ("python", "toml")
        for ln in body.replace("\\\n", " ").splitlines()
    ]
    for page in PAGES:  # page by page: a code span never runs from one page into the next
        prose = re.sub(FENCE + ".*?" + FENCE, "", page.read_text(), flags=re.S | re.M).replace("\\\n", " ")
        indented = r"^ {4,}(dmlbench .*)$"  # a code block by indentation
        lines += re.findall(indented, prose, flags=re.M)
        prose = re.sub(indented, "", prose, flags=re.M)
        spans = re.findall(r"`([^`]*)`", prose)  # backticks paired left to right, as Markdown pairs them
        lines += [" ".join(span.split()) for span in spans if re.search(r"dmlbench\s", span)]
    out = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        found = re.search(r"(?:^|[\s/])(dmlbench\s.*)", line)
        if found and "--" in found.group(1):
            out.append(found.group(1))
    return sorted(set(out))


COMMAND_LINES = _command_lines()


def _options(command: click.Command) -> set[str]:
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}


def test_readme_command_lines_name_real_options() -> None:
    """Every `--option` a command line of the docs shows exists on that command (or is the global --plugin)."""
    assert len(COMMAND_LINES) > 20
    ctx = click.Context(cli)
    wrong = []
    for line in COMMAND_LINES:
        try:
            tokens = shlex.split(line.replace("[", " ").replace("]", " ").replace("|", " "))
        except ValueError:
            tokens = line.split()
        tokens = tokens[1:]
        while tokens and tokens[0] == "--plugin":
            tokens = tokens[2:]
        if not tokens or tokens[0].startswith("-"):
            continue
        command = cli.get_command(ctx, tokens[0])
        if command is None:
            wrong.append(f"{line}: no command {tokens[0]!r}")
            continue
        known = _options(command)
        wrong += [
            f"{line}: {tokens[0]} has no {t.split('=')[0]}"
            for t in tokens[1:]
            if t.startswith("--") and t.split("=")[0] not in known
        ]
    assert not wrong, "\n".join(wrong)


def test_readme_links_resolve() -> None:
    """The README links into docs/ and benchmarks/ (outside the site, so the strict site build does not see
    them): every relative link names a file of the repository."""
    readme = PAGES[0].read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t]
    assert len(targets) > 10
    broken = [t for t in targets if not (REPO / t.split("#", 1)[0]).is_file()]
    assert not broken, broken


def test_readme_fits_a_first_hour() -> None:
    """The README is the first page, not the manual: reference text belongs on the site's pages."""
    assert len(PAGES[0].read_text().splitlines()) <= 300
