"""The protocol's schema, re-exported for callers at the protocol layer and above (`bench.spec.schema`)."""

from bench.spec.schema import (
    ABSENT_DEFAULTS,
    CHANNELS,
    DEFAULTS,
    METRICS,
    PRUNER_DEFAULTS,
    REID_METRICS,
    RESIZE_MODES,
    RETRIEVAL_METRICS,
    SCHEMA,
    describe_error,
    error_path,
    image_hw,
    setting,
)

__all__ = [
    "ABSENT_DEFAULTS",
    "CHANNELS",
    "DEFAULTS",
    "METRICS",
    "PRUNER_DEFAULTS",
    "REID_METRICS",
    "RESIZE_MODES",
    "RETRIEVAL_METRICS",
    "SCHEMA",
    "describe_error",
    "error_path",
    "image_hw",
    "setting",
]
