"""The one place dmlbench imports torchvision.

torchvision's Python parts (``models``, ``transforms.v2``) are plain torch
code, but its compiled operators (nms, roi_align, the image decoders) are
built against a CUDA torch. Beside the CPU-only torch wheel this project
installs (fast, small: see the README), those operators cannot load and
torchvision's import stops while registering fake-tensor kernels for them
("operator torchvision::nms does not exist"). dmlbench never calls those
operators (Pillow decodes images), so where they are missing it imports
torchvision without those registrations, which only ``torch.compile`` of
detection operators would use. Where torchvision imports normally (a CUDA
machine with matching wheels) nothing is changed.
"""

from __future__ import annotations

import sys
import types
from typing import Any

_STUB = "torchvision._meta_registrations"


def torchvision() -> Any:
    """The torchvision module, importable beside a CPU-only torch (see the module docstring).

    Call it before importing torchvision or timm (which imports torchvision)."""
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    try:
        import torchvision as tv
    except RuntimeError as error:
        if "torchvision::" not in str(error):
            raise
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules[_STUB] = types.ModuleType(_STUB)
        import torchvision as tv
    return tv
