"""What a protocol may say, at the bottom of the house: its schema and defaults (`schema`), the bounded
safe YAML loader (`safe_yaml`) and the typed sections every layer reads (`sections`). Nothing here
imports above `bench.errors`, so data readers, trunks and evaluation can read a protocol's settings."""

from bench.spec.sections import (
    DataSpec,
    EarlyStoppingSpec,
    EvaluationSpec,
    FinalSpec,
    GridSpec,
    LoaderSpec,
    MethodSpec,
    ModelSpec,
    PrunerSpec,
    SeedRangeSpec,
    Spec,
    SplitSpec,
    StrategySpec,
    TrainingSpec,
    TuningSpec,
    ValidationSpec,
)

__all__ = [
    "DataSpec",
    "EarlyStoppingSpec",
    "EvaluationSpec",
    "FinalSpec",
    "GridSpec",
    "LoaderSpec",
    "MethodSpec",
    "ModelSpec",
    "PrunerSpec",
    "SeedRangeSpec",
    "Spec",
    "SplitSpec",
    "StrategySpec",
    "TrainingSpec",
    "TuningSpec",
    "ValidationSpec",
]
