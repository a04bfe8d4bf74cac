"""Fetch a model's weights inside the serving pod, in its `weights` init container.

    python3 -m horizonserve.operator.model_fetch huggingface --repo Qwen/Qwen2.5-Omni-7B \\
        --cache-dir /var/lib/horizonserve/model-cache/hub [--revision main]

The cache is looked at first, offline: a repo already there (a PVC cache, a restarted
container whose emptyDir survived) is served without touching the network, so an offline node
keeps serving. Otherwise the whole snapshot is downloaded (token from HF_TOKEN, given to this
container alone). The last line, also written as the container's termination message, says
what happened; the operator shows it in the OmniService's `WeightsReady` condition.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import time
from pathlib import Path

TERMINATION_LOG_ENV = "TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"


def say(line: str) -> None:
    """Print the outcome and leave it as the termination message (best effort)."""
    print(line, flush=True)
    with contextlib.suppress(OSError):
        Path(os.environ.get(TERMINATION_LOG_ENV, DEFAULT_TERMINATION_LOG)).write_text(line)


def _size(path: Path) -> tuple[int, int]:
    """(files, bytes) under a snapshot directory, following the cache's symlinks."""
    files = total = 0
    for item in path.rglob("*"):
        if item.is_file():
            files += 1
            total += item.stat().st_size
    return files, total


def _why(exc: BaseException, repo: str) -> str:
    """A failure in words, with the field to fix."""
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        return (
            f"{repo} is gated: accept its terms on huggingface.co with the account whose token "
            "is in spec.modelSource.huggingFace.tokenSecret"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return (
            f"{repo} not found, or private and the token (spec.modelSource.huggingFace."
            "tokenSecret) is missing or refused"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"{repo}: no such revision (spec.modelSource.huggingFace.revision)"
    if isinstance(exc, errors.LocalEntryNotFoundError):
        return (
            f"{repo} is not in the cache and the hub cannot be reached from this node; fill a "
            "PVC with the model and use modelSource.pvc, or give the node network access"
        )
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"{repo}: disk full; raise spec.modelSource.cache.sizeLimit"
    return f"{repo}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def huggingface(repo: str, revision: str | None, cache_dir: str) -> int:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    label = f"{repo}@{revision}" if revision else repo
    start = time.monotonic()
    try:
        path = snapshot_download(
            repo, revision=revision, cache_dir=cache_dir, local_files_only=True
        )
        how = "already in the cache"
    except LocalEntryNotFoundError:
        print(f"{label}: not in the cache; downloading into {cache_dir}", flush=True)
        try:
            path = snapshot_download(repo, revision=revision, cache_dir=cache_dir)
        except Exception as exc:  # every failure ends as one line for the operator
            say(_why(exc, label))
            return 1
        how = f"downloaded in {time.monotonic() - start:.0f}s"
    except Exception as exc:
        say(_why(exc, label))
        return 1
    files, size = _size(Path(path))
    say(f"{label}: {files} files, {size / 2**30:.2f} GiB, {how}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m horizonserve.operator.model_fetch")
    sub = parser.add_subparsers(dest="kind", required=True)
    hf = sub.add_parser("huggingface", help="snapshot a Hugging Face repo into a cache")
    hf.add_argument("--repo", required=True)
    hf.add_argument("--revision", default=None)
    hf.add_argument("--cache-dir", required=True)
    args = parser.parse_args(argv)
    # HOME, HF_HOME and TMPDIR point into the cache volume (the root filesystem is read-only);
    # they may not exist yet on a fresh volume.
    for name in ("HOME", "HF_HOME", "TMPDIR"):
        if os.environ.get(name):
            Path(os.environ[name]).mkdir(parents=True, exist_ok=True)
    return huggingface(args.repo, args.revision, args.cache_dir)


if __name__ == "__main__":
    sys.exit(main())
