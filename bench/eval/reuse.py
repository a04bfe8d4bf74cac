"""Carry finished items of an earlier campaign into a new one, when nothing they measured changed.

An item is carried over only when the new plan runs it on the identical point (the same request
list, byte for byte once serialised), with the same pipeline, preset, SLO table and calibration
artifact, and only for the systems named — those whose code path did not change between the two
campaigns (the caller vouches for that; the summary records who was carried and from where).
The records and step rows are copied unchanged; the summary row gains `carried_from`.

    python bench/eval/campaign.py carry --plan NEW/plan.json --from OLD_RUN \
        --systems fcfs,edf,mps,edf-mps --out NEW/s0
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

# One reader of the per-item gzip members, shared with the simulator fit.
from horizonserve.runtime.calibrate.records import load_plan, read_members

SAME_KEYS = ("pipeline", "preset", "slo", "downstream")


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def mismatch(new: dict[str, Any], old: dict[str, Any]) -> str | None:
    """Why items of `old` cannot stand for `new` (None when the set-up is the same)."""
    for key in SAME_KEYS:
        if new.get(key) != old.get(key):
            return f"plans differ in {key!r}"
    if new["artifact"].get("sha256") != old["artifact"].get("sha256"):
        return "plans use different calibration artifacts"
    return None


def carry(
    plan: dict[str, Any], plan_sha256: str, src: Path, systems: set[str], out: Path
) -> list[str]:
    """Copy `src`'s finished items of `systems` that `plan` would run identically into `out`."""
    old_plan = load_plan(src / "plan.json")
    why = mismatch(plan, old_plan)
    if why:
        raise SystemExit(f"carry: {why}; nothing carried")
    same_points = {
        pid
        for pid, p in plan["points"].items()
        if pid in old_plan["points"]
        and _digest(p["requests"]) == _digest(old_plan["points"][pid]["requests"])
    }
    items = plan["items"]
    wanted = {i["id"] for i in items if i["system"] in systems and i["point"] in same_points}
    summary: dict[str, Any] = {
        "plan_sha256": plan_sha256,
        "carried_from": str(src),
        "systems": sorted(systems),
        "items": {},
    }
    out.mkdir(parents=True, exist_ok=True)
    for part in sorted(src.glob("s*/summary.json")):
        rows = json.loads(part.read_text())["items"]
        keep = {k: v for k, v in rows.items() if k in wanted and v.get("status") == "ok"}
        for item_id, row in keep.items():
            summary["items"][item_id] = {**row, "carried_from": str(part.parent)}
        for name in ("records.jsonl.gz", "steps.jsonl.gz"):
            with open(out / name, "ab") as f:
                for member in read_members(part.parent / name):
                    if member["item"] in keep:
                        f.write(gzip.compress((json.dumps(member) + "\n").encode()))
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return sorted(summary["items"])
