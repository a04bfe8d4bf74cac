"""Measured campaign runs, as the fit reads them (`bench/eval/campaign.py` writes them).

A campaign directory holds `plan.json` (committed gzipped as `plan.json.gz`, see `plan_bytes`;
points: rate, long-path share, seed, duration and the request list; items: point × system ×
repetition; the SLO table) and one folder per device session `s*/` with `summary.json` (item
status, which items were run again) and `records.jsonl.gz`: one gzip member per item, a JSON
line per request (class, path, arrival offset, first response, `slo_met`); `steps.jsonl.gz`
likewise holds the engine's step trace. A finished session may be stored compacted
(`bench/eval/compaction.py`): the same JSON lines, byte for byte, in one xz stream
`*.jsonl.xz`; the readers here take either. An item counts from
the last session that ran it with status ok, where a later session replaces an earlier one only
when it re-ran it on purpose (`redo`) — the rule of the campaign's own report. A session named
`sNN-repeat` (`REPEAT_SUFFIX`: runs added later, which the report counts as further
repetitions for its spread) is not read here: a fit reads the runs it was fitted to, and a
shipped fit's provenance replays exactly those. Attainment is
recomputed from the records: every request of the item counts; one without a first response is
a miss. With `warmup_s`, only requests that arrived at or after it count (the steady-state
view).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import statistics
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# The name ending of a session folder whose items are runs again of items an earlier session
# counts (bench/eval/report.py counts them as the next repetitions; `read_campaign` skips them).
REPEAT_SUFFIX = "-repeat"


def plan_bytes(path: str | Path) -> bytes:
    """The JSON bytes of a campaign plan at `path`, or of its gzipped copy `path` + ".gz".

    Plans are request lists of a few MB; they are committed gzipped. A plan's identity (the
    `plan_sha256` every session records) is the digest of these JSON bytes, so a plan keeps it
    when it is compressed. Where neither file exists the error names both."""
    p = Path(path)
    if p.is_file():
        data = p.read_bytes()
        return gzip.decompress(data) if p.suffix == ".gz" else data
    gz = p.with_name(p.name + ".gz")
    if gz.is_file():
        return gzip.decompress(gz.read_bytes())
    raise FileNotFoundError(f"no campaign plan at {p} (nor {gz.name})")


def load_plan(path: str | Path) -> dict[str, Any]:
    """The campaign plan at `path` (plain or gzipped, `plan_bytes`)."""
    return json.loads(plan_bytes(path))


def read_plan(path: str | Path) -> tuple[dict[str, Any], str]:
    """The campaign plan at `path` and its identity, the sha256 of its JSON bytes (the
    `plan_sha256` a session records)."""
    data = plan_bytes(path)
    return json.loads(data), hashlib.sha256(data).hexdigest()


def session_control(plan: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """The control knobs a session's HorizonServe items ran with: as its summary records them
    (`control`), or, for a session older than that record, its plan's knobs and the defaults it
    noted for knobs newer than the plan (`control_defaults`; `calibrate.legacy.recorded_control`
    fills in what neither names)."""
    if "control" in summary:
        return dict(summary["control"])
    return {**plan["serving_config"].get("control", {}), **summary.get("control_defaults", {})}


def _member_bytes(path: Path, *, whole: bool = False) -> bytes:
    """The JSON lines of a file of concatenated gzip members, decompressed; a truncated last
    member is skipped (a run cut while writing it), or with `whole` refused."""
    data = path.read_bytes()
    parts: list[bytes] = []
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            text = d.decompress(data)
        except zlib.error:
            text = b""
        if not d.eof:
            if whole:
                raise ValueError(f"{path}: a truncated gzip member; leave this file as it is")
            break
        parts.append(text)
        data = d.unused_data
    return b"".join(parts)


def read_members(path: Path) -> list[Any]:
    """JSON lines from `path`, a file of concatenated gzip members (`_member_bytes`), or from
    its compacted copy (`X.jsonl.gz` -> `X.jsonl.xz`, bench/eval/compaction.py); missing: empty."""
    if path.exists():
        text = _member_bytes(path)
    elif (xz := path.with_suffix(".xz")).exists():
        text = lzma.decompress(xz.read_bytes())
    else:
        return []
    return [json.loads(line) for line in text.decode().splitlines() if line.strip()]


@dataclass(frozen=True)
class CampaignPoint:
    id: str
    rate: float
    long_ratio: float | None
    seed: int
    duration_s: float
    n_requests: int
    burstiness: float = 1.0  # the arrivals' gamma shape (1: Poisson)


@dataclass(frozen=True)
class MeasuredItem:
    """One point × system, the mean over its repetitions."""

    point: str
    system: str
    attainment: float
    short_attainment: float | None
    long_attainment: float | None
    reps: tuple[float, ...]  # attainment of each repetition
    sessions: tuple[str, ...]
    item_ids: tuple[str, ...] = ()  # each repetition's item id in its session
    # The control knobs the first repetition's session ran (`session_control`: its summary's
    # record, else its plan's knobs and the defaults it noted); None for a campaign read
    # without sessions. A plan's knobs are not enough: a session takes the defaults of knobs
    # newer than its plan.
    control: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        return f"{self.point}/{self.system}"


@dataclass(frozen=True)
class Campaign:
    path: str
    pipeline: str
    targets_s: dict[str, float]  # the SLO the campaign measured against, per class
    multiplier: float
    artifact_path: str
    points: dict[str, CampaignPoint]
    items: dict[str, MeasuredItem]  # key "point/system"
    warmup_s: float = 0.0
    superseded: list[str] = field(default_factory=list)
    control: dict[str, Any] = field(default_factory=dict)  # the plan's recorded control knobs
    # The SLO table the campaign's controller ran (the plan's serving config: each class's SLO,
    # priority and the profile behind its r̂), and the engine preset / deploy profile it ran.
    serving_slo: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None
    profile: str | None = None


def _share(records: list[dict[str, Any]], path: str | None) -> float | None:
    rs = [r for r in records if path is None or r["path"] == path]
    return sum(1 for r in rs if r["slo_met"]) / len(rs) if rs else None


def read_campaign(run: str | Path, warmup_s: float = 0.0) -> Campaign:
    """The measured items of campaign directory `run` (module docstring)."""
    root = Path(run)
    try:
        plan = load_plan(root / "plan.json")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"--records {root}: no plan.json(.gz) (not a campaign directory)"
        ) from None
    chosen: dict[str, tuple[str, list[dict[str, Any]], dict[str, Any]]] = {}
    superseded: list[str] = []
    controls: dict[str, dict[str, Any]] = {}  # session -> the knobs it ran
    for sdir in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("s")):
        if not (sdir / "summary.json").exists() or sdir.name.endswith(REPEAT_SUFFIX):
            continue
        summary = json.loads((sdir / "summary.json").read_text())
        controls[sdir.name] = session_control(plan, summary)
        recs = {m["item"]: m["records"] for m in read_members(sdir / "records.jsonl.gz")}
        redo = set(summary.get("redo", ()))
        for item_id, meta in summary.get("items", {}).items():
            if meta.get("status") != "ok" or item_id not in recs:
                continue
            if item_id in chosen:
                if item_id not in redo:
                    continue
                superseded.append(f"{item_id} ({chosen[item_id][0]} → {sdir.name})")
            chosen[item_id] = (sdir.name, recs[item_id], meta)
    groups: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {}
    ids: dict[str, list[str]] = {}
    for item_id, (session, recs, meta) in chosen.items():
        kept = [r for r in recs if r.get("arrival_offset_s", 0.0) >= warmup_s]
        groups.setdefault(f"{meta['point']}/{meta['system']}", []).append((session, kept))
        ids.setdefault(f"{meta['point']}/{meta['system']}", []).append(item_id)
    items: dict[str, MeasuredItem] = {}
    for key, reps in sorted(groups.items()):
        point, system = key.split("/", 1)
        att = [_share(r, None) for _s, r in reps]
        att_ok = [a for a in att if a is not None]
        if not att_ok:
            continue

        def mean(path: str, reps: list[tuple[str, list[dict[str, Any]]]] = reps) -> float | None:
            xs = [x for _s, r in reps if (x := _share(r, path)) is not None]
            return statistics.fmean(xs) if xs else None

        items[key] = MeasuredItem(
            point=point,
            system=system,
            attainment=statistics.fmean(att_ok),
            short_attainment=mean("short"),
            long_attainment=mean("long"),
            reps=tuple(att_ok),
            sessions=tuple(s for s, _r in reps),
            item_ids=tuple(ids[key]),
            control=controls[reps[0][0]],
        )
    return replace(plan_campaign(plan, str(root), warmup_s), items=items, superseded=superseded)


def plan_campaign(plan: dict[str, Any], path: str, warmup_s: float = 0.0) -> Campaign:
    """The campaign a plan describes, before any run: its points, SLO table, serving config and
    engine (no measured items). `read_campaign` adds what the sessions measured."""
    points = {
        pid: CampaignPoint(
            id=pid,
            rate=float(p["rate"]),
            long_ratio=p.get("long_ratio"),
            seed=int(p["seed"]),
            duration_s=float(p["duration_s"]),
            n_requests=len(p["requests"]),
            burstiness=float(p.get("burstiness", 1.0)),
        )
        for pid, p in plan["points"].items()
    }
    return Campaign(
        path=path,
        pipeline=plan["pipeline"],
        targets_s={k: float(v) for k, v in plan["slo"].items()},
        multiplier=float(plan["serving_config"]["slo"]["multiplier"]),
        artifact_path=plan["artifact"]["path"],
        points=points,
        items={},
        warmup_s=warmup_s,
        control=dict(plan["serving_config"].get("control", {})),
        serving_slo=dict(plan["serving_config"]["slo"]),
        preset=plan.get("preset"),
        profile=plan.get("profile"),
    )


def read_steps(campaign: Campaign, key: str) -> list[dict[str, Any]]:
    """The shared stage's per-step rows of item `key` (point/system), one member of
    `steps.jsonl.gz` per repetition: {"item", "columns", "rows"} (the engine's step trace)."""
    it = campaign.items[key]
    out = []
    for session, item_id in zip(it.sessions, it.item_ids, strict=True):
        members = read_members(Path(campaign.path) / session / "steps.jsonl.gz")
        out.extend(m for m in members if m.get("item") == item_id)
    return out
