"""The bounded, safe YAML loader, re-exported for callers at the protocol layer and above
(`bench.spec.safe_yaml`)."""

from bench.spec.safe_yaml import MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES, YamlRefused, load_yaml, read_text

__all__ = ["MAX_YAML_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_NODES", "YamlRefused", "load_yaml", "read_text"]
