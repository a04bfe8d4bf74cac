"""Packaging: every package folder is installed under the horizonserve namespace."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _declared() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(data["tool"]["setuptools"]["packages"])


def test_every_package_folder_is_declared() -> None:
    found = set()
    for top in ("runtime", "operator"):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT).parts
            found.add(".".join(("horizonserve", *rel)))
    missing = sorted(found - _declared())
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_operator_does_not_shadow_the_standard_library() -> None:
    import operator

    assert hasattr(operator, "itemgetter")
    assert importlib.import_module("horizonserve.operator").__name__ == "horizonserve.operator"


def test_console_script_has_all_subcommands() -> None:
    from horizonserve.runtime.cli import SUBCOMMANDS

    assert set(SUBCOMMANDS) >= {"bench", "sim", "calibrate", "serve", "sidecar"}
