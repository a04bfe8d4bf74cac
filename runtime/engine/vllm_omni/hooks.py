"""Run a callback when a module is imported (at once if it already is).

The plugin is loaded in every vLLM / vLLM-Omni process (API server, engine cores, workers, the
diffusion process), but each patch concerns modules only some of them import. Importing those
modules from `register()` would load the API server's stack into every worker (and fail on
hosts missing its optional dependencies); a post-import hook patches each module wherever, and
whenever, it is really imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

Callback = Callable[[ModuleType], Any]

_pending: dict[str, list[Callback]] = {}


class HookRefused(RuntimeError):
    """Raised by a callback that must stop the import (and so the process): never swallowed."""


_lock = threading.RLock()


def _run(module: ModuleType, callbacks: list[Callback]) -> None:
    for callback in callbacks:
        try:
            callback(module)
        except HookRefused:
            raise
        except Exception:  # a broken patch must not break vLLM's import
            log.exception("HorizonServe: patching %s failed", module.__name__)


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the module's callbacks."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Later imports see the real loader (importlib.resources, reload, pickling by spec).
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        module.__loader__ = self._inner
        self._inner.exec_module(module)
        with _lock:
            callbacks = _pending.pop(self._name, [])
        _run(module, callbacks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        with _lock:
            if fullname not in _pending:
                return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _Finder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


_finder = _Finder()


def when_imported(name: str, callback: Callback) -> None:
    """Call `callback(module)` once `name` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None) if module is not None else None
    if module is not None and spec is not None and not isinstance(spec.loader, _Loader):
        _run(module, [callback])  # already imported (and not mid-import through our loader)
        return
    with _lock:
        _pending.setdefault(name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def pending() -> dict[str, int]:
    """Module names still awaited, with their callback counts (diagnostics, tests)."""
    with _lock:
        return {k: len(v) for k, v in _pending.items()}
