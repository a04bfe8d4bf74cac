"""Report of a simulated sweep: raw JSON, a compact text table, and matplotlib figures.

Figures follow the paper's: attainment vs arrival rate and vs long-path share (Fig. 8),
per-class p95 first-response latency (Fig. 9), the control trace (Fig. 10) and the ablation
bars (Fig. 11). Every file says "simulated".
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from horizonserve.runtime.bench.sweep import representative_rate, select
from horizonserve.runtime.sim.systems import SYSTEMS

_STYLE = {
    "horizon": ("tab:red", "o", "-"),
    "fcfs": ("tab:gray", "s", "--"),
    "edf": ("tab:blue", "^", "--"),
    "mps": ("tab:green", "v", "--"),
    "edf-mps": ("tab:purple", "D", "--"),
    "horizon-no-rotation": ("tab:orange", "x", ":"),
    "horizon-no-throttling": ("tab:brown", "+", ":"),
}


def _label(system: str) -> str:
    return SYSTEMS[system].label if system in SYSTEMS else system


def _pct(v: float | None) -> str:
    return "  –  " if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:5.1f}"


def summary_table(raw: dict[str, Any]) -> str:
    """A compact text table: attainment per system at every sweep point, then the findings."""
    systems = list(
        dict.fromkeys(r["system"] for r in raw["results"] if r["point"]["sweep"] != "trace")
    )
    head = f"{'':>16}" + "".join(f"{s[:13]:>14}" for s in systems)
    lines = [
        f"HorizonServe bench — SIMULATED ({raw['pipeline']}, {raw['model']}); "
        f"SLO = {raw['slo']['multiplier']:g} x solo p95 (simulated)",
        _artifact_line(raw),
        "SLO attainment % (all classes; short-path in parentheses)",
        head,
    ]
    for sweep, key, fmt in (("rate", "rate", "λ={:g}/s"), ("long", "long_ratio", "long={:.0%}")):
        rows = select(raw, sweep)
        for v in sorted({r["point"][key] for r in rows}):
            by = {r["system"]: r for r in rows if r["point"][key] == v}
            cells = []
            for s in systems:
                r = by.get(s)
                cells.append(
                    f"{_pct(r['attainment'])} ({_pct(r['short_attainment']).strip():>5})"
                    if r
                    else f"{'':>14}"
                )
            tag = fmt.format(v) + (f" @{rows[0]['point']['rate']:g}/s" if sweep == "long" else "")
            lines.append(f"{tag:>16}" + "".join(f"{c:>14}" for c in cells))
    rep = representative_rate(raw)
    if rep is not None:
        lines += ["", *_detail_lines(raw, rep)]
    f = raw.get("findings", {})
    lines.append("")
    lines += findings_lines(f)
    t = raw.get("timing", {})
    lines.append(
        f"wall: {t.get('total_wall_s', 0):.1f} s (solo SLO runs {t.get('solo_wall_s', 0):.1f} s)"
    )
    return "\n".join(lines)


def _artifact_line(raw: dict[str, Any]) -> str:
    a = raw.get("artifact", {})
    measured = a.get("measured", str(a.get("source", "")).startswith("measured"))
    kind = (
        "measured on the GPU by horizonserve calibrate"
        if measured
        else "ESTIMATE, not a GPU calibration"
    )
    return f"calibration artifact: {a.get('file', '?')} ({kind}; key {a.get('key', '?')})"


def _sim_tag(raw: dict[str, Any]) -> str:
    """ "SIMULATED (<artifact file name>)" for figure titles."""
    name = Path(str(raw.get("artifact", {}).get("file", ""))).name
    return f"SIMULATED ({name})" if name else "SIMULATED"


def _detail_lines(raw: dict[str, Any], rate: float) -> list[str]:
    """Goodput, shared-stage TPOT and the SM cap per system at one rate (cf. paper Table 3)."""
    rows = [r for r in select(raw, "rate") if r["point"]["rate"] == rate]
    out = [
        f"at λ={rate:g}/s: {'system':<22}{'attain':>8}{'goodput/s':>11}"
        f"{'TPOT p50/p95 ms':>17}{'co-run':>8}{'cap':>6}"
    ]
    for r in rows:
        st = r["stats"]
        tpot = f"{r['tpot_p50_ms'] or 0:.1f}/{r['tpot_p95_ms'] or 0:.1f}"
        cap = st.get("mean_cap_corun")
        out.append(
            f"{'':>{len(f'at λ={rate:g}/s: ')}}{_label(r['system']):<22}"
            f"{_pct(r['attainment']):>8}{r['goodput_rps']:>11.2f}{tpot:>17}"
            f"{100 * (st.get('corun_frac') or 0):>7.0f}%{'' if cap is None else f'{cap:.0f}':>6}"
        )
    return out


def findings_lines(f: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, title in (("stressed_rate", "most stressed arrival rate"), ("max_long_ratio", "")):
        c = f.get(key)
        if not c or "ratio" not in c:
            continue
        where = (
            f"λ={c['rate']:g}/s ({title})"
            if key == "stressed_rate"
            else f"long-path {c['long_ratio']:.0%} at λ={c['rate']:g}/s"
        )
        ratio = "n/a (best baseline 0 %)" if c["ratio"] is None else f"{c['ratio']:.2f}x"
        line = (
            f"{where}: HorizonServe {_pct(c['horizon']).strip()} % vs best baseline "
            f"{_label(c['best_baseline'])} {_pct(c['best_baseline_attainment']).strip()} % "
            f"-> {ratio}"
        )
        if "best_non_mps_baseline" in c and c["best_non_mps_baseline"] != c["best_baseline"]:
            nm = c["non_mps_ratio"]
            line += (
                f"; vs best without MPS {_label(c['best_non_mps_baseline'])} "
                f"{_pct(c['best_non_mps_attainment']).strip()} % -> "
                + ("n/a (0 %)" if nm is None else f"{nm:.2f}x")
            )
        out.append(line)
        for a in ("horizon-no-rotation", "horizon-no-throttling"):
            if f"{a}_loss" in c:
                out.append(
                    f"    ablation {_label(a)}: {_pct(c[f'{a}_attainment']).strip()} % "
                    f"(loss {100 * c[f'{a}_loss']:+.1f} points)"
                )
    fc = f.get("fcfs_short_vs_long_ratio")
    if fc:
        pts = ", ".join(f"{x:.0%}: {_pct(v).strip()}" for x, v in fc["points"])
        out.append(f"FCFS short-path attainment vs long-path share: {pts} (falls: {fc['falls']})")
    pc = f.get("per_class_p95")
    if pc and pc.get("mean_reduction") is not None:
        out.append(
            f"per-class p95 at λ={pc['rate']:g}/s: HorizonServe vs best baseline per class, "
            f"mean reduction {100 * pc['mean_reduction']:.1f} %"
        )
    sp = f.get("speed")
    if sp and sp.get("per_core_x_real_time"):
        out.append(
            f"simulator speed: {sp['per_core_x_real_time']:.0f}x real time per core, "
            f"{sp['sweep_x_real_time']:.0f}x for the whole sweep "
            f"({sp['simulated_s']:.0f} simulated s)"
        )
    return out


# -- figures --------------------------------------------------------------------------------------
def _plt() -> Any:
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _line(ax: Any, rows: list[dict[str, Any]], key: str, scale: float = 1.0) -> None:
    for s in dict.fromkeys(r["system"] for r in rows):
        pts = sorted((r["point"][key], r["attainment"]) for r in rows if r["system"] == s)
        color, marker, ls = _STYLE.get(s, ("black", ".", "-"))
        ax.plot(
            [x * scale for x, _ in pts],
            [100 * (y or 0.0) for _, y in pts],
            color=color,
            marker=marker,
            linestyle=ls,
            label=_label(s),
        )


def fig_attainment(raw: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    rate_rows, long_rows = select(raw, "rate"), select(raw, "long")
    _line(axes[0], rate_rows, "rate")
    axes[0].set_xlabel("arrival rate (req/s)")
    _line(axes[1], long_rows, "long_ratio", 100)
    rate = long_rows[0]["point"]["rate"] if long_rows else float("nan")
    axes[1].set_xlabel(f"long-path requests (%) at {rate:g} req/s")
    for ax in axes:
        ax.set_ylabel("SLO attainment (%)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"{_sim_tag(raw)} — {raw['pipeline']}: SLO attainment (cf. paper Fig. 8)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig_per_class(raw: dict[str, Any], path: Path) -> None:
    plt = _plt()
    rows = select(raw, "rate")
    if not rows:
        return
    top = representative_rate(raw)
    by = {r["system"]: r for r in rows if r["point"]["rate"] == top}
    classes = list(next(iter(by.values()))["classes"])
    systems = list(by)
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(classes)), 4.2))
    width = 0.8 / len(systems)
    for j, s in enumerate(systems):
        vals = [by[s]["classes"][c]["p95_s"] for c in classes]
        ys = [v if v is not None else 0.0 for v in vals]
        color = _STYLE.get(s, ("black",))[0]
        xs = [i + (j - (len(systems) - 1) / 2) * width for i in range(len(classes))]
        ax.bar(xs, ys, width, color=color, label=_label(s))
        for x, v in zip(xs, vals, strict=True):
            if v is None:  # unanswered within the run: p95 beyond the horizon
                ax.annotate("∞", (x, 0.0), xycoords=("data", "axes fraction"), ha="center")
    targets = [next(iter(by.values()))["classes"][c]["target_s"] for c in classes]
    ax.scatter(
        range(len(classes)), targets, marker="_", s=600, color="black", label="SLO", zorder=3
    )
    ax.set_yscale("log")
    ax.set_xticks(range(len(classes)))
    ax.set_xticklabels(classes, rotation=20, fontsize=8)
    ax.set_ylabel("p95 first-response latency (s)")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(
        f"{_sim_tag(raw)} — per-class p95 first response at λ={top:g}/s\n"
        "(cf. paper Fig. 9; ∞: unbounded)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig_ablation(raw: dict[str, Any], path: Path) -> None:
    plt = _plt()
    f = raw.get("findings", {})
    groups = [(k, f[k]) for k in ("stressed_rate", "max_long_ratio") if f.get(k)]
    if not groups:
        return
    systems = ["horizon", "horizon-no-rotation", "horizon-no-throttling"]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(systems)
    for j, s in enumerate(systems):
        ys = []
        for _, c in groups:
            v = c.get("horizon") if s == "horizon" else c.get(f"{s}_attainment")
            ys.append(100 * (v or 0.0))
        xs = [i + (j - 1) * width for i in range(len(groups))]
        ax.bar(xs, ys, width, color=_STYLE[s][0], label=_label(s))
    labels = [
        f"λ={c['rate']:g}/s" if k == "stressed_rate" else f"{c['long_ratio']:.0%} long"
        for k, c in groups
    ]
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(labels)
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8)
    ax.set_title(f"{_sim_tag(raw)} — ablation (cf. paper Fig. 11)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig_trace(raw: dict[str, Any], path: Path) -> None:
    plt = _plt()
    rows = [r for r in raw["results"] if r.get("trace")]
    if not rows:
        return
    r = rows[0]
    tr = r["trace"]
    fig, axes = plt.subplots(3, 1, figsize=(10, 6), sharex=True)
    axes[0].step(tr["t"], tr["down_jobs"], where="post", color="tab:green")
    axes[0].set_ylabel("downstream\nrequests")
    axes[1].plot(tr["t"], tr["pressure"], color="tab:blue", lw=0.8)
    axes[1].set_ylabel("memory pressure\n(EWMA)")
    axes[2].step(tr["t"], tr["cap"], where="post", color="tab:red")
    axes[2].set_ylabel("shared-stage\nSM cap")
    axes[2].set_xlabel("time (s)")
    p = r["point"]
    fig.suptitle(
        f"{_sim_tag(raw)} — HorizonServe control trace, λ={p['rate']:g}/s, "
        f"{(p['long_ratio'] or 0):.0%} long-path (cf. paper Fig. 10)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(raw: dict[str, Any], out_dir: Path, plots: bool = True) -> list[Path]:
    """results.json, trace.json, summary.txt and the figures; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    traces = [r["trace"] for r in raw["results"] if r.get("trace")]
    slim = {
        **raw,
        "results": [{k: v for k, v in r.items() if k != "trace"} for r in raw["results"]],
    }
    p = out_dir / "results.json"
    p.write_text(json.dumps(clean_json(slim), indent=1, allow_nan=False) + "\n")
    written.append(p)
    if traces:  # the control trace (Fig. 10), compact
        p = out_dir / "trace.json"
        data = {"label": raw["label"], "trace": traces[0]}
        p.write_text(json.dumps(clean_json(data), allow_nan=False) + "\n")
        written.append(p)
    p = out_dir / "summary.txt"
    p.write_text(summary_table(raw) + "\n")
    written.append(p)
    if plots:
        for name, fn in (
            ("fig8_attainment.png", fig_attainment),
            ("fig9_p95_per_class.png", fig_per_class),
            ("fig10_control_trace.png", fig_trace),
            ("fig11_ablation.png", fig_ablation),
        ):
            fn(raw, out_dir / name)
            if (out_dir / name).exists():
                written.append(out_dir / name)
    return written


def clean_json(o: Any) -> Any:
    """NaN/inf → null and numpy scalars → Python, recursively (strict JSON)."""
    if isinstance(o, dict):
        return {str(k): clean_json(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [clean_json(v) for v in o]
    if hasattr(o, "item") and not isinstance(o, str):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o
