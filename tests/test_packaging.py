"""Packaging: every package folder is installed under the horizonserve namespace, and the
README's two commands work on a fresh venv."""

from __future__ import annotations

import importlib
import os
import shutil
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


# -- the README's two commands on a fresh venv ----------------------------------------------------
def readme_commands() -> list[str]:
    """The two command lines of the README's first ```bash block."""
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_readme_starts_with_the_install_and_the_test_command() -> None:
    install, test = readme_commands()
    steps = install.split(" && ")
    assert steps[0] == "python3 -m venv .venv"
    assert steps[1].startswith(".venv/bin/pip install -e '.[dev]'")
    assert steps[2] == ".venv/bin/horizonserve bench"
    assert test == ".venv/bin/python -m pytest"
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "dev"
    ]
    assert "torch==2.13.0" in dev  # the engine tests need it; the pin vLLM 0.30.0 uses


def _copy_tracked(dest: Path) -> None:
    """The working tree's tracked files (as a fresh clone would have them, with local edits)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        rel = raw.decode()
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def test_readme_commands_in_a_fresh_venv(tmp_path: Path) -> None:
    """The README's first command's install, exactly, in a fresh venv of a copy of the tree
    (pip may use its local cache); its bench on a bounded sweep; then the second command on
    the CLI and one torch engine module, which must run, not skip."""
    install, _test = readme_commands()
    venv_step, pip_step, bench_step = install.split(" && ")
    tree = tmp_path / "clone"
    _copy_tracked(tree)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"

    def sh(cmd: str, timeout: float) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["bash", "-c", cmd], cwd=tree, env=env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    sh(f"{venv_step} && {pip_step} -q", timeout=900)
    torch_version = sh(".venv/bin/python -c 'import torch; print(torch.__version__)'", 60)
    assert torch_version.stdout.startswith("2.13.0")
    bounded = " --rates 4 --long-ratios 0.3 --duration 20 --systems horizon,fcfs --no-plots"
    out = sh(f"{bench_step}{bounded} --out bench-out --no-progress", timeout=300).stdout
    assert "SIMULATED" in out and (tree / "bench-out" / "results.json").exists()
    smoke = sh(
        ".venv/bin/python -m pytest -q -p no:cacheprovider tests/cli "
        "tests/runtime/engine/test_engine_batching.py",
        timeout=300,
    ).stdout
    assert " passed" in smoke and " skipped" not in smoke, smoke[-2000:]
