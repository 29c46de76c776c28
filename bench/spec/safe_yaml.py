"""Safe, bounded YAML for the files a user hands dmlbench (protocols, claims).

A protocol names registry entries and numbers, never code, so it is read
with a safe loader (no tags, no objects) that also refuses duplicate keys,
which a plain loader would silently resolve to the last one, and keys that
are not text. The file may come from anyone: it is bounded in size, nesting
and alias expansion (an alias bomb of 9 levels of 9 expands to 387 million
values), so a hostile file is refused in milliseconds instead of filling
memory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from bench.errors import BenchError


class YamlRefused(BenchError):
    """A file that is not valid YAML or exceeds a bound: ``FILE[:LINE]: what``."""


MAX_YAML_BYTES = 1_000_000  # a protocol or claims file is a few kilobytes; more is not one we wrote
MAX_YAML_NODES = 100_000  # after expanding aliases: an alias bomb (9 levels of 9) would be 387 million
MAX_YAML_DEPTH = 64  # the deepest real protocol nests 5 levels


class Loader(yaml.SafeLoader):
    """Safe loading, YAML 1.2 floats (``1e-3`` is a number), text keys only and no duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                kind = "a list" if isinstance(key_node, yaml.SequenceNode) else "a mapping"
                raise yaml.constructor.ConstructorError(
                    None, None, f"a key must be text, got {kind}", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    None, None, f"a key must be text, got {type(key).__name__} {str(key)[:40]!r}", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)[eE][-+]?\d+$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."),
)


def read_text(path: Path, what: str) -> str:
    """A file's text as UTF-8; a missing, unreadable or non-UTF-8 file is one line naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise BenchError(f"{str(path)[:200]}: {what} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise BenchError(f"{str(path)[:200]}: cannot read {what}: {e.strerror or e}") from None


def _expanded_size(root: yaml.Node) -> int:
    """Nodes after expanding every alias; a node inside itself (``&a [*a]``) is a recursive document.

    Aliases share composed nodes, so the count is memoised per node: the
    check is linear in the file while the expansion it bounds is not.
    """
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int]] = [(root, 0)]
    open_nodes: set[int] = set()
    while stack:
        node, state = stack.pop()
        key = id(node)
        if state == 0:
            if key in sizes:
                continue
            if key in open_nodes:
                raise _YamlBound(node, "a recursive alias (a node that contains itself)")
            if len(open_nodes) >= MAX_YAML_DEPTH:
                raise _YamlBound(node, f"nested more than {MAX_YAML_DEPTH} levels deep")
            open_nodes.add(key)
            stack.append((node, 1))
            for child in _children(node):
                stack.append((child, 0))
        else:
            open_nodes.discard(key)
            total = 1 + sum(sizes.get(id(c), 0) for c in _children(node))
            if total > MAX_YAML_NODES:
                raise _YamlBound(node, f"expands to more than {MAX_YAML_NODES} values (aliases nested too deep?)")
            sizes[key] = total
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


class _YamlBound(Exception):
    def __init__(self, node: yaml.Node, problem: str) -> None:
        super().__init__(problem)
        self.node, self.problem = node, problem


def load_yaml(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    """The document and its node tree (for line numbers), or a YamlRefused naming the file.

    Bounded in size, depth and alias expansion, so a hostile file is refused
    in milliseconds instead of filling memory; recursive aliases, non-text
    and unhashable keys are refused too. Used for protocol and claims files.
    """
    if len(text) > MAX_YAML_BYTES:
        raise YamlRefused(f"{source}: not valid YAML: larger than {MAX_YAML_BYTES} characters")
    try:
        loader = Loader(text)  # the reader refuses NUL and control characters here
    except yaml.YAMLError as e:
        raise YamlRefused(f"{source}: not valid YAML: {str(e).splitlines()[-1]}") from None
    try:
        node = loader.get_single_node()
        if node is not None:
            _expanded_size(node)
        return loader.construct_document(node) if node is not None else None, node
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise YamlRefused(f"{where}: not valid YAML: {problem}") from None
    except _YamlBound as e:
        raise YamlRefused(f"{source}:{e.node.start_mark.line + 1}: refused YAML: {e.problem}") from None
    except RecursionError:
        raise YamlRefused(f"{source}: refused YAML: nested too deeply") from None
    finally:
        loader.dispose()
