"""Let PyPI's torchvision import beside torch 2.13.0+cpu (test venv only).

PyPI has torchvision only as a build against the CUDA torch: beside the CPU torch its C
extension does not load (libtorch_cuda.so is missing), so no `torchvision::*` operator exists.
torchvision 0.28 guards every fake-kernel registration of `_meta_registrations` on
`extension._has_ops()` except two, `torchvision::nms` and `torchvision::qnms`, which it
registers unconditionally: `import torchvision` then raises "operator torchvision::nms does not
exist". vLLM's Qwen2-VL family (so Qwen2.5-Omni's thinker) needs torchvision through
transformers' Qwen2-VL image processor (`torchvision.transforms.v2`), which is pure Python.

`install()` (run from a .pth file the install script writes) adds a meta-path finder that,
just before `torchvision._meta_registrations` loads, defines the schemas of those two
operators without any kernel. torchvision then imports unchanged; calling `nms` on this venv
raises (no CPU kernel), as it would have without the shim. Nothing in site-packages is edited.
The real fix is a CPU build of torchvision on PyPI (today only on PyTorch's own index).
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

TARGET = "torchvision._meta_registrations"
SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_libraries: list[Any] = []  # a torch Library keeps its definitions only while referenced


def define_missing_ops() -> list[str]:
    """Define the schemas torchvision registers fakes for when its C ops did not load."""
    import torch

    defined = []
    for schema in SCHEMAS:
        name = schema.split("(", 1)[0]
        if torch._C._dispatch_has_kernel(f"torchvision::{name}") or hasattr(
            torch.ops.torchvision, name
        ):
            continue
        lib = torch.library.Library("torchvision", "FRAGMENT")
        lib.define(schema)
        _libraries.append(lib)
        defined.append(name)
    return defined


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == TARGET:
            define_missing_ops()
        return None  # the normal finders load the module


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
