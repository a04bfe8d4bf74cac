"""Packaging: every package folder is installed under the horizonserve namespace."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _declared() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(data["tool"]["setuptools"]["packages"])


def test_every_package_folder_is_declared() -> None:
    found = set()
    for top in ("runtime", "operator"):
        for module in (ROOT / top).rglob("*.py"):
            rel = module.parent.relative_to(ROOT).parts
            if "__pycache__" not in rel:
                found.add(".".join(("horizonserve", *rel)))
    missing = sorted(found - _declared())
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"


def test_operator_does_not_shadow_the_standard_library() -> None:
    """`operator/` has no __init__.py: from the repository root, `import operator` must still
    find the standard library (a regular module beats a namespace portion on sys.path)."""
    assert not (ROOT / "operator" / "__init__.py").exists()
    code = "import operator, sys; sys.exit(0 if hasattr(operator, 'itemgetter') else 1)"
    done = subprocess.run([sys.executable, "-I", "-c", code], cwd=ROOT, check=False)
    assert done.returncode == 0
    plain = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert not plain.stdout.startswith(str(ROOT))
    assert importlib.import_module("horizonserve.operator").__name__ == "horizonserve.operator"


def test_console_script_has_all_subcommands() -> None:
    from horizonserve.runtime.cli import SUBCOMMANDS

    assert set(SUBCOMMANDS) >= {"bench", "sim", "calibrate", "serve", "sidecar"}
