"""bench.vision: torchvision's models and transforms.v2 import beside the CPU-only torch wheel."""

from __future__ import annotations

import subprocess
import sys


def test_torchvision_imports_and_its_python_parts_run() -> None:
    """In a fresh interpreter (nothing imported before): models build and a v2 pipeline transforms."""
    code = (
        "import torch\n"
        "from bench.vision import torchvision\n"
        "tv = torchvision()\n"
        "assert torchvision() is tv\n"
        "from torchvision.transforms import v2\n"
        "from torchvision.models import resnet18\n"
        "out = resnet18(num_classes=4).eval()(torch.rand(1, 3, 32, 32))\n"
        "assert out.shape == (1, 4)\n"
        "img = v2.RandomResizedCrop(16, scale=(0.5, 1.0))(torch.randint(0, 255, (3, 40, 30), dtype=torch.uint8))\n"
        "assert tuple(img.shape) == (3, 16, 16)\n"
        "import timm\n"
        "assert timm.create_model('resnet18', pretrained=False, num_classes=0).eval()(torch.rand(1, 3, 32, 32)).shape == (1, 512)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
