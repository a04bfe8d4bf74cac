"""The import rule: no part of the runtime imports a part above it (docs/architecture.md).

Layers, bottom to top: the control core (the modules directly in runtime/: config, artifact,
profiler, temporal, spatial, downstream, preemption, policy, ...); the leaf packages gpu,
monitor and workload (none imports another); engine; sim; calibrate; bench. Entry points sit
above all of them: every `cli` module, `cli_types` and the node `sidecar`. Every import counts,
module-level or inside a function. An AST walk of the sources, so a violation names its file.
"""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
PREFIX = "horizonserve.runtime"
# Bottom to top; a tuple is one layer of independent siblings.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("gpu", "monitor", "workload"),
    ("engine",),
    ("sim",),
    ("calibrate",),
    ("bench",),
    ("entry",),
)
ENTRY_MODULES = {"cli", "cli_types", "sidecar"}
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}


def _part(module: str) -> str:
    """The layer part of a dotted module name under horizonserve.runtime."""
    parts = module.split(".")[2:]  # after horizonserve.runtime
    if not parts or parts[-1] in ENTRY_MODULES:
        return "entry"
    first = parts[0]
    return first if first in RANK and first not in ("core", "entry") else "core"


def _module_of(path: Path) -> str:
    rel = path.relative_to(RUNTIME).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([PREFIX, *parts])


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import of a runtime module in `path`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == PREFIX:  # from horizonserve.runtime import x
                out += [(node.lineno, f"{PREFIX}.{a.name}") for a in node.names]
            elif node.module.startswith(PREFIX + "."):
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith(PREFIX + ".")]
    return out


def violations() -> list[str]:
    found = []
    for path in sorted(RUNTIME.rglob("*.py")):
        mine = _part(_module_of(path))
        for line, module in _imports(path):
            theirs = _part(module)
            if theirs == mine:
                continue
            if RANK[theirs] > RANK[mine] or (RANK[theirs] == RANK[mine] and theirs != mine):
                rel = path.relative_to(RUNTIME.parent)
                found.append(f"{rel}:{line}: {mine} imports {module} ({theirs})")
    return found


def test_no_package_imports_a_package_above_it() -> None:
    assert violations() == []


def test_the_rule_sees_a_violation() -> None:
    assert _part(f"{PREFIX}.sim.engine") == "sim" and _part(f"{PREFIX}.policy") == "core"
    assert _part(f"{PREFIX}.sim.cli") == "entry" and _part(f"{PREFIX}.sidecar") == "entry"
    assert RANK["calibrate"] > RANK["sim"] > RANK["engine"] > RANK["core"]


def test_the_runtime_never_imports_the_operator() -> None:
    for path in RUNTIME.rglob("*.py"):
        assert "horizonserve.operator" not in path.read_text(), path
