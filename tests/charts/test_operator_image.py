"""operator/Dockerfile, checked without a container engine: its instructions (non-root user,
entry point = the chart's command, nothing privileged), and the build step it runs (`pip
install .` on exactly the files it copies) producing a distribution with the operator's entry
module and the runtime's data files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .chartlib import OPERATOR_COMMAND, OPERATOR_DOCKERFILE, PIPELINES, ROOT

Instruction = tuple[str, str]  # (INSTRUCTION, arguments)


def instructions(path: Path) -> list[Instruction]:
    """Dockerfile instructions with line continuations joined and comments dropped."""
    out: list[Instruction] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, "dangling line continuation"
    return out


def stages(instrs: list[Instruction]) -> list[list[Instruction]]:
    out: list[list[Instruction]] = []
    for ins in instrs:
        if ins[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return instructions(OPERATOR_DOCKERFILE)


def test_final_stage_runs_unprivileged_with_the_chart_command(
    dockerfile: list[Instruction],
) -> None:
    final = stages(dockerfile)[-1]
    users = [args for ins, args in final if ins == "USER"]
    assert users, "the final stage must switch to a non-root USER"
    uid = users[-1].split(":")[0]
    # Numeric, so the kubelet can enforce runAsNonRoot without reading /etc/passwd; and the
    # same UID the chart's podSecurityContext runs as.
    assert uid.isdigit() and int(uid) != 0
    assert int(uid) == 65532
    (entry,) = [args for ins, args in final if ins == "ENTRYPOINT"]
    assert json.loads(entry) == OPERATOR_COMMAND
    assert ("EXPOSE", "8080") in final  # kopf's liveness endpoint (the chart's probe)


def test_base_images_are_pinned_and_nothing_privileged(dockerfile: list[Instruction]) -> None:
    args = dict(a.split("=", 1) for ins, a in dockerfile if ins == "ARG" and "=" in a)
    stages = {a.split()[-1] for ins, a in dockerfile if ins == "FROM" and " AS " in a.upper()}
    for ins, a in dockerfile:
        if ins != "FROM" or a.split()[0] in stages:  # FROM an earlier stage: not a base image
            continue
        image = a.split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), image)
        assert ":" in image and not image.endswith(":latest"), f"unpinned base image {image}"
    text = OPERATOR_DOCKERFILE.read_text()
    for forbidden in ("--privileged", "sudo ", "chmod 777", "| sh", "| bash", "ADD http"):
        assert forbidden not in text, forbidden


def test_image_installs_the_distribution_without_gpu_extras(
    dockerfile: list[Instruction],
) -> None:
    runs = " ".join(a for ins, a in dockerfile if ins == "RUN")
    installs = re.search(r"pip install (--no-deps )?\.(\s|$)", runs)
    assert installs, "the image installs the project itself"
    assert "[gpu" not in runs and "vllm" not in runs, "the operator needs no GPU stack"


def copied_sources(dockerfile: list[Instruction]) -> list[str]:
    srcs: list[str] = []
    for ins, a in dockerfile:
        if ins != "COPY" or a.startswith("--from"):
            continue
        parts = a.split()
        srcs += [p.rstrip("/") for p in parts[:-1] if not p.startswith("--")]
    return srcs


def test_copied_sources_exist(dockerfile: list[Instruction]) -> None:
    srcs = copied_sources(dockerfile)
    assert {"pyproject.toml", "README.md", "runtime", "operator"} <= set(srcs)
    for src in srcs:
        assert (ROOT / src).exists(), f"COPY {src}: not in the repository"


def test_build_context_makes_a_complete_distribution(
    dockerfile: list[Instruction], tmp_path: Path
) -> None:
    """`pip install .` as the image runs it, on exactly what the Dockerfile copies: the wheel
    holds the operator's entry module and the runtime's pipeline data (the operator loads the
    pipelines to translate an OmniService)."""
    context = tmp_path / "context"
    context.mkdir()
    for src in copied_sources(dockerfile):
        path = ROOT / src
        if path.is_dir():
            shutil.copytree(
                path, context / src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(path, context / src)
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), "."],
        cwd=context,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    (wheel,) = tmp_path.glob("horizonserve-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "horizonserve/operator/__main__.py" in names, (
        "no horizonserve/operator/__main__.py: `python -m horizonserve.operator` (the image's "
        "entry point) would fail"
    )
    for pipeline in PIPELINES:
        assert f"horizonserve/runtime/data/pipelines/{pipeline}.json" in names
