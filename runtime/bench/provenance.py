"""Where a run came from, and running it again there.

Every campaign and simulation records `record()`: the git commit of the code that ran it
(and whether that code had uncommitted changes), its command line, and the fully resolved
`ServingConfig` (the policy's preset applied to the control axes). A replay checks that
commit's code out (`checkout`: `git archive` of the package directories into a scratch
directory, nothing in the repository touched) and runs the recorded command with it
(`run_at`): today's code never has to imitate yesterday's controller.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path
from typing import Any

from horizonserve.runtime.config import ServingConfig

REPO = Path(__file__).resolve().parents[2]  # the checkout this package runs from
PACKAGE_DIRS = ("runtime", "operator")  # what `horizonserve.*` maps to (pyproject.toml)
_MAIN = "import sys; from horizonserve.runtime.cli import main; sys.exit(main(sys.argv[1:]))"


def _git(*args: str, root: Path = REPO) -> str:
    out = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.strip()


def git_commit(root: Path = REPO) -> dict[str, Any]:
    """{"commit": HEAD's sha (None outside a git checkout), "dirty": whether the package
    directories differ from it (such a run cannot be replayed exactly)}."""
    try:
        sha = _git("rev-parse", "HEAD", root=root)
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", *PACKAGE_DIRS))
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": sha, "dirty": dirty}


def resolved(config: ServingConfig) -> dict[str, Any]:
    """`config` as it runs: its control with the policy's preset applied, as JSON."""
    return config.model_copy(update={"control": config.resolved()}).model_dump(mode="json")


def record(config: ServingConfig | None = None, argv: Sequence[str] | None = None) -> dict:
    """What a run records about itself (module docstring)."""
    return {
        **git_commit(),
        "argv": list(sys.argv[1:] if argv is None else argv),
        "serving_config": None if config is None else resolved(config),
    }


@contextmanager
def checkout(commit: str, root: Path = REPO) -> Iterator[Path]:
    """A scratch directory importable as `horizonserve` at `commit` (its package directories,
    from `git archive`); removed afterwards. ValueError naming the commit if git lacks it."""
    try:
        data = subprocess.run(
            ["git", "-C", str(root), "archive", "--format=tar", commit, *PACKAGE_DIRS],
            capture_output=True,
            check=True,
            timeout=300,
        ).stdout
    except subprocess.CalledProcessError as exc:
        raise ValueError(
            f"commit {commit}: not in {root} ({exc.stderr.decode().strip()}); fetch it first"
        ) from None
    scratch = Path(tempfile.mkdtemp(prefix="hs-replay-"))
    try:
        tree = scratch / "horizonserve"  # the directory itself is the namespace package
        with tarfile.open(fileobj=BytesIO(data)) as tar:
            tar.extractall(tree, filter="data")
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_at(
    commit: str, argv: Sequence[str], root: Path = REPO, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`horizonserve ARGV` with the code of `commit` (output captured)."""
    with checkout(commit, root) as path:
        paths = [str(path), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        return subprocess.run(
            [sys.executable, "-c", _MAIN, *argv],
            env=env,
            cwd=cwd or Path.cwd(),
            capture_output=True,
            text=True,
            timeout=3600,
        )
