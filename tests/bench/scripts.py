"""Load a bench/eval script as a module, the way it runs: its folder on the path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EVAL = Path(__file__).resolve().parents[2] / "bench" / "eval"


def load_eval_script(name: str) -> ModuleType:
    """bench/eval/<name>.py as a fresh module (report.py imports campaign.py beside it;
    dataclasses resolve their module by name, so it is registered while it loads)."""
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", EVAL / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EVAL))
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(EVAL))
    return mod
