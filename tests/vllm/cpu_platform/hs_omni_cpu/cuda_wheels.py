"""Let PyPI's torchvision and torchaudio import beside torch 2.13.0+cpu (test venv only).

PyPI has both only as builds against the CUDA torch: beside the CPU torch their C extensions
do not load (libc10_cuda.so / libtorch_cuda.so are missing). vLLM-Omni needs both on its
serving path, for pure-Python parts only:
  * torchvision.transforms.v2, through transformers' Qwen2-VL image processor, which vLLM's
    Qwen2.5-Omni thinker imports. torchvision 0.28 guards every fake-kernel registration of
    `_meta_registrations` on `extension._has_ops()` except two, `torchvision::nms` and
    `torchvision::qnms`: `import torchvision` raises "operator torchvision::nms does not
    exist". The shim defines those two schemas, without kernels, just before that module
    loads.
  * torchaudio.functional / transforms (resampling, spectrograms in the OpenAI audio layer).
    torchaudio 2.11 runs without its extension when the library file is absent
    (`_load_lib` returns False), but raises when the file is there and cannot load. The shim
    makes `_load_lib` report such a CUDA-linked library as absent.
Nothing in site-packages is edited: `install()` (run from a .pth file the install script
writes) adds a meta-path finder that acts when those modules are imported. Calling a C op of
either package on this venv raises, as it would have without the shim. The real fix is CPU
builds of torchvision / torchaudio on PyPI (today only on PyTorch's own index).
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

TV_META = "torchvision._meta_registrations"
TA_UTILS = "torchaudio._extension.utils"
TV_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_libraries: list[Any] = []  # a torch Library keeps its definitions only while referenced


def define_torchvision_schemas() -> list[str]:
    """Define the schemas torchvision registers fakes for when its C ops did not load."""
    import torch

    defined = []
    for schema in TV_SCHEMAS:
        name = schema.split("(", 1)[0]
        if hasattr(torch.ops.torchvision, name):
            continue
        lib = torch.library.Library("torchvision", "FRAGMENT")
        lib.define(schema)
        _libraries.append(lib)
        defined.append(name)
    return defined


def patch_torchaudio_loader(utils: Any) -> None:
    """`_load_lib` returns False (extension absent) for a library linked to the CUDA torch."""
    orig = utils._load_lib

    def _load_lib(lib: str) -> bool:
        try:
            return orig(lib)
        except OSError as exc:
            if "cuda" in str(exc).lower() or "could not load" in str(exc).lower():
                return False
            raise

    utils._load_lib = _load_lib


class _AfterExec(importlib.abc.Loader):
    def __init__(self, inner: Any, after: Any) -> None:
        self._inner, self._after = inner, after

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__spec__.loader = module.__loader__ = self._inner
        self._inner.exec_module(module)
        self._after(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname == TV_META:
            define_torchvision_schemas()
            return None  # the normal finders load the module
        if fullname != TA_UTILS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                spec.loader = _AfterExec(spec.loader, patch_torchaudio_loader)
                return spec
        return None


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
