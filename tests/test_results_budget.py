"""bench/results keeps to the size budget docs/results.md states ("What bench/results keeps"):
a new campaign that outgrows it fails here, not in a reviewer's clone. Exemptions are listed
below with their reason; an exemption its folder no longer needs fails too."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections import defaultdict
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20
KB = 1000

_spec = importlib.util.spec_from_file_location("results_index", ROOT / "bench/results_index.py")
assert _spec is not None and _spec.loader is not None
results_index = importlib.util.module_from_spec(_spec)
sys.modules["results_index"] = results_index  # dataclasses resolve the module by name
_spec.loader.exec_module(results_index)

# The budget (docs/results.md): bytes as `du -b` counts them, a symlink as its own length.
SESSION = 1 * MiB  # one device call's raw records and step traces
RUN = 1 * MiB  # a report folder's own files, or any other run folder
SIMULATED = MiB // 2  # a simulated sweep or fit (sim/*, sim-fit*/, sim-reserved-step/)
CAMPAIGN = 5 * MiB  # a report folder with the sessions it holds or links
SESSIONS_FOLDER = 2 * MiB  # eval-vN/'s own files: the plans and COMMAND.txt its sessions share
TEXT_FILE = 200 * KB  # larger text, JSON or logs are committed gzipped or xz
FIGURE = 200 * KB
RAW_SUFFIXES = (".jsonl.gz", ".jsonl.xz")  # a session's records and traces, compressed

LIMITS = {
    "session": SESSION,
    "run": RUN,
    "simulated": SIMULATED,
    "sessions-folder": SESSIONS_FOLDER,
}

# folder -> (its own limit, why it needs more). Keep this short.
EXEMPT: dict[str, tuple[int, str]] = {
    "bench/results/calibration/h200-2": (
        3 * MiB // 2,
        "the three pipelines' raw calibration logs that `horizonserve calibrate rebuild` "
        "rebuilds the shipped runtime/data/calibration/h200-measured.json from "
        "(tests/runtime/calibrate/test_rebuild.py)",
    ),
}


def _folders() -> tuple[dict[str, int], dict[str, int], dict[str, str], set[str]]:
    """(bytes per budget folder, bytes per campaign in all, each folder's kind, sessions)."""
    tree = results_index.Tree.load(ROOT)
    sessions = {
        os.path.dirname(f) for f in tree.size if f.endswith(RAW_SUFFIXES) and f not in tree.links
    }
    own: dict[str, int] = defaultdict(int)
    kind: dict[str, str] = {}
    for f, size in tree.size.items():
        session = next((s for s in sessions if f.startswith(s + "/")), None)
        parts = PurePosixPath(f).parts  # bench, results, area, ...
        if session is not None:
            folder, k = session, "session"
        elif len(parts) >= 5 and not results_index.SESSION_CONTAINERS.match("/".join(parts[:4])):
            folder, k = "/".join(parts[:4]), "run"
        elif results_index.SESSION_CONTAINERS.match(os.path.dirname(f)):
            folder, k = os.path.dirname(f), "sessions-folder"
        else:  # an area's own files
            folder, k = os.path.dirname(f), "run"
        if parts[2].startswith("sim") and k == "run":
            k = "simulated"
        own[folder] += size
        kind[folder] = k

    def linked(path: str) -> int:
        return sum(tree.size[f] for f in tree.under(path)) if path in tree.dirs else 0

    campaigns: dict[str, int] = defaultdict(int)
    for f, size in tree.size.items():
        parts = PurePosixPath(f).parts
        folder = "/".join(parts[:4])
        if parts[2] != "h200-eval" or len(parts) < 5:
            continue
        if results_index.SESSION_CONTAINERS.match(folder):
            continue
        campaigns[folder] += size
        if f in tree.links:
            target = tree.links[f]
            campaigns[folder] += linked(target) or tree.size.get(target, 0)
    return dict(own), dict(campaigns), kind, sessions


def test_every_folder_keeps_to_its_budget() -> None:
    own, campaigns, kind, _ = _folders()
    limits = LIMITS
    over = []
    for folder, size in sorted(own.items()):
        limit = EXEMPT[folder][0] if folder in EXEMPT else limits[kind[folder]]
        if size > limit:
            over.append(f"{folder}: {size / MiB:.2f} MiB > {limit / MiB:.2f} MiB ({kind[folder]})")
    for folder, size in sorted(campaigns.items()):
        if size > CAMPAIGN:
            over.append(f"{folder}: {size / MiB:.2f} MiB with its sessions > {CAMPAIGN / MiB} MiB")
    assert not over, "over the size budget (docs/results.md):\n" + "\n".join(over)


def test_large_files_are_compressed() -> None:
    tree = results_index.Tree.load(ROOT)
    over = []
    for f, size in sorted(tree.size.items()):
        if f in tree.links or f.endswith((".gz", ".xz")):
            continue
        limit = FIGURE if f.endswith(".png") else TEXT_FILE
        if size > limit:
            over.append(f"{f}: {size / KB:.0f} kB > {limit / KB:.0f} kB")
        if f.endswith(".jsonl"):
            over.append(f"{f}: raw records go in compressed ({', '.join(RAW_SUFFIXES)})")
    assert not over, "store these compressed or smaller (docs/results.md):\n" + "\n".join(over)


def test_each_exemption_is_still_needed() -> None:
    own, _, kind, _ = _folders()
    limits = LIMITS
    stale = [
        f"{folder}: {'gone' if folder not in own else f'{own[folder] / MiB:.2f} MiB fits'}"
        for folder in EXEMPT
        if folder not in own or own[folder] <= limits[kind[folder]]
    ]
    assert not stale, f"exemptions no longer needed (remove them): {stale}"


def test_the_budget_finds_the_sessions_and_campaigns() -> None:
    """The folders the budget checks are the ones bench/results holds: sessions under
    eval-v5 and inside the first evaluation, campaigns with linked sessions."""
    own, campaigns, kind, sessions = _folders()
    assert "bench/results/h200-eval/eval-v5/q28" in sessions
    assert "bench/results/h200-eval/qwen2_5_omni-2/s1" in sessions
    assert kind["bench/results/h200-eval/qwen-ship-v2"] == "run"
    assert kind["bench/results/sim/baselines-2026"] == "simulated"
    # qwen-ship-v2 links its sessions (s00 -> ../eval-v5/q28): counted in the campaign
    assert (
        campaigns["bench/results/h200-eval/qwen-ship-v2"]
        > own["bench/results/h200-eval/qwen-ship-v2"] + own["bench/results/h200-eval/eval-v5/q28"]
    )
