"""Report of a simulated sweep: raw JSON, a compact text table, and matplotlib figures.

Figures follow the paper's: attainment vs arrival rate and vs long-path share (Fig. 8),
per-class p95 first-response latency (Fig. 9), the control trace (Fig. 10) and the ablation
bars (Fig. 11). Every file says "simulated".
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Any

from horizonserve.runtime.bench.sweep import representative_rate, select
from horizonserve.runtime.sim.systems import ABLATIONS, BASELINES, SYSTEMS

# Linestyle by family: HorizonServe solid, its ablations dotted, baselines dashed. Colours and
# markers follow the registry's order, so every system (also one added later) gets its own.
_COLORS = (
    "tab:red", "tab:gray", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:cyan",
    "tab:olive", "tab:brown", "tab:pink", "black", "gold", "navy", "lime", "maroon", "teal",
)  # fmt: skip
_MARKERS = ("o", "s", "^", "v", "D", "x", "P", "*", "+", "<", ">", "h", "p", "1", "2", "3")
NOTE_WIDTH = 100


def system_style(system: str) -> tuple[str, str, str]:
    """(colour, marker, linestyle) of a system, stable across figures."""
    names = list(SYSTEMS)
    i = names.index(system) if system in names else len(names)
    ls = "-" if system == "horizon" else ":" if system.startswith("horizon-") else "--"
    return _COLORS[i % len(_COLORS)], _MARKERS[i % len(_MARKERS)], ls


def note(text: str) -> str:
    """A footer line wrapped to NOTE_WIDTH, continuation lines indented."""
    return textwrap.fill(text, NOTE_WIDTH, subsequent_indent="    ", break_on_hyphens=False)


def systems_note(systems: list[str]) -> str:
    """What each system name stands for (the registry's name is the only name used)."""
    described = "; ".join(f"{s} = {SYSTEMS[s].label}" for s in systems if s in SYSTEMS)
    return note(f"systems: {described}")


def _pct(v: float | None) -> str:
    return "  –  " if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:5.1f}"


def _swept_systems(raw: dict[str, Any]) -> list[str]:
    return list(
        dict.fromkeys(r["system"] for r in raw["results"] if r["point"]["sweep"] != "trace")
    )


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return ""
    return f"{_pct(r['attainment'])} ({_pct(r['short_attainment']).strip():>5})"


def _sweep_table(raw: dict[str, Any], sweep: str, systems: list[str]) -> list[str]:
    """Systems as rows, the sweep's points as columns (names never cut)."""
    key = "rate" if sweep == "rate" else "long_ratio"
    rows = select(raw, sweep)
    if not rows:
        return []
    values = sorted({r["point"][key] for r in rows})
    tags = [f"{v:g}/s" if sweep == "rate" else f"{v:.0%} long" for v in values]
    width = max(len("system"), *(len(s) for s in systems)) + 2
    title = (
        "attainment % vs arrival rate (default class mix)"
        if sweep == "rate"
        else f"attainment % vs long-path share at {rows[0]['point']['rate']:g} req/s"
    )
    out = [title, f"{'system':<{width}}" + "".join(f"{t:>14}" for t in tags)]
    for s in systems:
        by = {r["point"][key]: r for r in rows if r["system"] == s}
        out.append(f"{s:<{width}}" + "".join(f"{_cell(by.get(v)):>14}" for v in values))
    return out


ATTAINMENT_NOTE = (
    "cells: SLO attainment % over all classes (share of requests answered within their class's "
    "first-response SLO), short-path classes' attainment in parentheses"
)


def summary_table(raw: dict[str, Any]) -> str:
    """The text report: attainment per system at every sweep point, details, findings."""
    systems = _swept_systems(raw)
    lines = [
        f"HorizonServe bench — SIMULATED ({raw['pipeline']}, {raw['model']}); "
        f"SLO = {raw['slo']['multiplier']:g} x solo p95 (simulated)",
        _artifact_line(raw),
        "",
        *_sweep_table(raw, "rate", systems),
        "",
        *_sweep_table(raw, "long", systems),
        note(ATTAINMENT_NOTE),
    ]
    why = long_share_note(raw)
    if why:
        lines.append(note(why))
    rep = representative_rate(raw)
    if rep is not None:
        lines += ["", *_detail_lines(raw, rep)]
    lines.append("")
    lines += findings_lines(raw.get("findings", {}))
    lines.append(systems_note(systems))
    t = raw.get("timing", {})
    lines.append(
        f"wall: {t.get('total_wall_s', 0):.1f} s (solo SLO runs {t.get('solo_wall_s', 0):.1f} s)"
    )
    return "\n".join(lines)


def long_share_note(raw: dict[str, Any]) -> str | None:
    """Why attainment can *rise* with the long-path share at a fixed request rate.

    The sweep holds requests/s fixed, not shared-stage work. When the short-path classes ask
    the shared stage for more decode tokens than the long-path ones (typed answers are longer
    than spoken ones in the shipped workloads), fewer long-path requests mean more shared-stage
    work, and at 0 % long-path nothing runs downstream, so every policy behaves alike on a
    saturated shared stage. Stated with the run's own numbers, only when the trend shows.
    """
    rows = select(raw, "long")
    if not rows:
        return None
    lo = min(r["point"]["long_ratio"] for r in rows)
    hi = max(r["point"]["long_ratio"] for r in rows)
    at_lo = [r for r in rows if r["point"]["long_ratio"] == lo]
    at_hi = {r["system"]: r for r in rows if r["point"]["long_ratio"] == hi}
    rising = [
        r
        for r in at_lo
        if (at_hi.get(r["system"], {}).get("attainment") or 0) > (r["attainment"] or 0)
    ]
    if lo >= hi or len(rising) * 2 < len(at_lo):
        return None
    busy = [r["stats"].get("shared_busy_frac") or 0.0 for r in at_lo]
    corun = [r["stats"].get("corun_frac") or 0.0 for r in at_lo]
    att = [100 * (r["attainment"] or 0.0) for r in at_lo]
    tokens = raw.get("workload_tokens", {})
    why_tokens = ""
    if tokens.get("short") and tokens.get("long"):
        why_tokens = (
            f"a short-path answer averages {tokens['short']:.0f} shared-stage output tokens, a "
            f"long-path one {tokens['long']:.0f}, so "
        )
    return (
        f"why attainment rises with the long-path share here: the sweep holds "
        f"{rows[0]['point']['rate']:g} req/s fixed, and {why_tokens}fewer long-path requests "
        f"mean more shared-stage work. At {lo:.0%} long-path the shared stage is busy "
        f"{_span(busy)} % of the time with nothing downstream "
        f"(co-running {100 * max(corun):.0f} %), so every system saturates alike "
        f"({_span(att, 1.0, '.1f')} %)"
        + (
            "; at that load the backlog grows for the whole run, so the number depends on "
            "--duration"
            if min(busy) >= 0.97
            else ""
        )
        + ". This is the workload, not the policies; the "
        "paper's Fig. 8 trend (falling with the share) comes from downstream contention, "
        "which this calibration artifact makes small."
    )


def _span(values: list[float], scale: float = 100.0, fmt: str = ".0f") -> str:
    """ "a–b" of `scale` × values (one number when both ends print the same)."""
    lo, hi = (format(scale * v, fmt) for v in (min(values), max(values)))
    return lo if lo == hi else f"{lo}–{hi}"


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


DETAIL_NOTE = (
    "columns: attain = SLO attainment %; goodput/s = requests answered within their SLO per "
    "second; TPOT = shared-stage time per output token (p50/p95, ms); co-run = share of time "
    "downstream stages ran beside the shared stage; SM cap = mean SMs the shared stage may use "
    "while they do (132 = the whole GPU, i.e. uncapped)"
)


def _detail_lines(raw: dict[str, Any], rate: float) -> list[str]:
    """Goodput, shared-stage TPOT and the SM cap per system at one rate (cf. paper Table 3)."""
    rows = [r for r in select(raw, "rate") if r["point"]["rate"] == rate]
    width = max(len("system"), *(len(r["system"]) for r in rows)) + 2
    out = [
        f"details at {rate:g} req/s ("
        + (
            "the highest swept rate at which horizon still attains 90 %)"
            if any(r["system"] == "horizon" and (r["attainment"] or 0) >= 0.9 for r in rows)
            else "the lowest swept rate: horizon attains 90 % at none)"
        ),
        f"{'system':<{width}}{'attain':>8}{'goodput/s':>11}{'TPOT p50/p95 ms':>17}"
        f"{'co-run':>8}{'SM cap':>8}",
    ]
    for r in rows:
        st = r["stats"]
        tpot = f"{r['tpot_p50_ms'] or 0:.1f}/{r['tpot_p95_ms'] or 0:.1f}"
        cap = st.get("mean_cap_corun")
        out.append(
            f"{r['system']:<{width}}{_pct(r['attainment']):>8}{r['goodput_rps']:>11.2f}"
            f"{tpot:>17}{100 * (st.get('corun_frac') or 0):>7.0f}%"
            f"{'–' if cap is None else f'{cap:.0f}':>8}"
        )
    out.append(note(DETAIL_NOTE))
    return out


def _versus(delta_points: float) -> str:
    """An attainment difference (other − horizon, points) read from horizon's side."""
    if abs(delta_points) < 0.05:
        return "same as horizon"
    return f"{delta_points:+.1f} points vs horizon: " + ("worse" if delta_points < 0 else "better")


def findings_lines(f: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key in ("stressed_rate", "max_long_ratio"):
        c = f.get(key)
        if not c or "ratio" not in c:
            continue
        where = (
            f"at {c['rate']:g} req/s (the most stressed rate)"
            if key == "stressed_rate"
            else f"at {c['long_ratio']:.0%} long-path, {c['rate']:g} req/s"
        )
        ratio = "n/a (best baseline 0 %)" if c["ratio"] is None else f"{c['ratio']:.2f}x"
        line = (
            f"{where}: horizon {_pct(c['horizon']).strip()} % vs the best baseline "
            f"{c['best_baseline']} {_pct(c['best_baseline_attainment']).strip()} %: "
            f"horizon / best = {ratio}"
        )
        if "best_non_mps_baseline" in c and c["best_non_mps_baseline"] != c["best_baseline"]:
            nm = c["non_mps_ratio"]
            line += (
                f"; vs the best without MPS, {c['best_non_mps_baseline']} "
                f"{_pct(c['best_non_mps_attainment']).strip()} %: "
                + ("n/a (0 %)" if nm is None else f"{nm:.2f}x")
            )
        out.append(note(line + " (above 1x: horizon attains more)"))
        for a in (a for a in ABLATIONS if f"{a}_loss" in c):
            out.append(
                f"    ablation {a}: {_pct(c[f'{a}_attainment']).strip()} % "
                f"({_versus(-100 * c[f'{a}_loss'])})"
            )
    fc = f.get("fcfs_short_vs_long_ratio")
    if fc:
        pts = ", ".join(f"{x:.0%} long: {_pct(v).strip()} %" for x, v in fc["points"])
        trend = "falls" if fc["falls"] else "does not fall"
        out.append(
            note(
                f"fcfs short-path attainment vs long-path share ({pts}): it {trend} from the "
                "lowest to the highest share (the paper's Fig. 3 expects it to fall)"
            )
        )
    pc = f.get("per_class_p95")
    if pc and pc.get("mean_reduction") is not None:
        change = -100 * pc["mean_reduction"]
        verdict = "worse" if change > 0 else "better" if change < 0 else "same"
        per = ", ".join(
            f"{name} {-100 * c['reduction']:+.0f} %"
            for name, c in pc["classes"].items()
            if c.get("reduction") is not None
        )
        out.append(
            note(
                f"p95 first response at {pc['rate']:g} req/s, horizon vs the best baseline of "
                f"each class (+ = horizon slower): mean {change:+.1f} % ({verdict}); {per}"
            )
        )
    sp = f.get("speed")
    if sp and sp.get("per_core_x_real_time"):
        out.append(
            f"simulator speed: {sp['per_core_x_real_time']:.0f}x real time per core, "
            f"{sp['sweep_x_real_time']:.0f}x for the whole sweep "
            f"({sp['simulated_s']:.0f} simulated s)"
        )
    return out


def combined_summary(raws: dict[str, dict[str, Any]], wall_s: float) -> str:
    """One table over pipelines (`bench --pipeline all`): horizon vs the best baseline."""
    lines = [
        "SIMULATED summary, all pipelines",
        f"{'pipeline':<14}{'point':<22}{'horizon %':>10}{'best baseline':>24}{'horizon/best':>14}",
    ]
    for pipeline, raw in raws.items():
        f = raw.get("findings", {})
        for key in ("stressed_rate", "max_long_ratio"):
            c = f.get(key)
            if not c or "ratio" not in c:
                continue
            where = (
                f"{c['rate']:g} req/s"
                if key == "stressed_rate"
                else f"{c['long_ratio']:.0%} long @{c['rate']:g}/s"
            )
            best = f"{c['best_baseline']} {_pct(c['best_baseline_attainment']).strip()}"
            ratio = "n/a" if c["ratio"] is None else f"{c['ratio']:.2f}x"
            lines.append(f"{pipeline:<14}{where:<22}{_pct(c['horizon']):>10}{best:>24}{ratio:>14}")
    lines.append(
        note(
            "columns: point = the most stressed arrival rate and the highest long-path share "
            "of each pipeline's sweep; horizon % = its SLO attainment there; best baseline = "
            "the baseline with the highest attainment there, and its attainment %; "
            "horizon/best = their ratio (above 1x: horizon attains more)"
        )
    )
    lines.append(f"wall: {wall_s:.1f} s for {len(raws)} pipelines")
    return "\n".join(lines)


# -- figures --------------------------------------------------------------------------------------
def _plt() -> Any:
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _line(ax: Any, rows: list[dict[str, Any]], key: str, scale: float, step: float) -> None:
    """One line per system; overlapping lines are told apart by marker, style and a small
    horizontal offset (±`step`/2 in data units across the systems)."""
    systems = list(dict.fromkeys(r["system"] for r in rows))
    n = len(systems)
    for j, s in enumerate(systems):
        pts = sorted((r["point"][key], r["attainment"]) for r in rows if r["system"] == s)
        color, marker, ls = system_style(s)
        dx = (j - (n - 1) / 2) * step / max(n, 1)
        ax.plot(
            [x * scale + dx for x, _ in pts],
            [100 * (y or 0.0) for _, y in pts],
            color=color,
            marker=marker,
            linestyle=ls,
            markersize=6,
            markerfacecolor="none" if j % 2 else color,
            linewidth=2.2 if s == "horizon" else 1.3,
            alpha=0.9,
            label=s,
            zorder=3 if s == "horizon" else 2,
        )


def _legend_right(fig: Any, ax: Any, solid_bars: bool = False) -> None:
    """The legend outside the axes, to the right of the figure's plots (`solid_bars`: one
    plain colour patch per system, whatever the first bar's hatching)."""
    handles, labels = ax.get_legend_handles_labels()
    if solid_bars:
        from matplotlib.patches import Patch

        handles = [
            h if lab not in SYSTEMS else Patch(color=system_style(lab)[0])
            for h, lab in zip(handles, labels, strict=True)
        ]
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)


def fig_attainment(raw: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    rate_rows, long_rows = select(raw, "rate"), select(raw, "long")
    _line(axes[0], rate_rows, "rate", 1.0, 0.25)
    axes[0].set_xlabel("arrival rate (req/s)")
    _line(axes[1], long_rows, "long_ratio", 100, 4.0)
    rate = long_rows[0]["point"]["rate"] if long_rows else float("nan")
    axes[1].set_xlabel(f"long-path requests (%) at {rate:g} req/s")
    for ax in axes:
        ax.set_ylabel("SLO attainment (%)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"{_sim_tag(raw)} — {raw['pipeline']}: SLO attainment (cf. paper Fig. 8); "
        "points offset sideways so overlapping lines show",
        fontsize=10,
    )
    fig.tight_layout()
    _legend_right(fig, axes[0])
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def fig_per_class(raw: dict[str, Any], path: Path) -> None:
    """p95 per class for horizon and the baselines (the ablations are in fig11)."""
    plt = _plt()
    rows = select(raw, "rate")
    if not rows:
        return
    top = representative_rate(raw)
    by = {r["system"]: r for r in rows if r["point"]["rate"] == top}
    classes = list(next(iter(by.values()))["classes"])
    systems = [s for s in by if s == "horizon" or s in BASELINES] or list(by)
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(classes)), 4.2))
    width = 0.8 / len(systems)
    finite = [
        v for s in systems for c in classes if (v := by[s]["classes"][c]["p95_s"]) is not None
    ]
    top_y = 3 * max(finite) if finite else 10.0  # unbounded bars reach up to here
    unbounded = False
    for j, s in enumerate(systems):
        vals = [by[s]["classes"][c]["p95_s"] for c in classes]
        xs = [i + (j - (len(systems) - 1) / 2) * width for i in range(len(classes))]
        color = system_style(s)[0]
        ys = [top_y if v is None else v for v in vals]
        bars = ax.bar(xs, ys, width, color=color, label=s)
        for bar, v in zip(bars, vals, strict=True):
            if v is None:  # never answered within the run: p95 beyond the horizon
                unbounded = True
                bar.set_hatch("//")
                bar.set_facecolor("none")
                bar.set_edgecolor(color)
        labels = ["∞" if v is None else f"{v:.2g}" for v in vals]
        ax.bar_label(bars, labels=labels, fontsize=6, rotation=90, padding=2)
    targets = [next(iter(by.values()))["classes"][c]["target_s"] for c in classes]
    ax.scatter(
        range(len(classes)), targets, marker="_", s=900, color="black", label="SLO", zorder=3
    )
    ax.set_yscale("log")
    ax.set_ylim(top=top_y * 4)
    ax.set_xticks(range(len(classes)))
    ax.set_xticklabels(classes, rotation=20, fontsize=8)
    ax.set_ylabel("p95 first-response latency (s)")
    ax.set_title(
        f"{_sim_tag(raw)} — per-class p95 first response at {top:g} req/s (cf. paper Fig. 9)"
        + (
            "\nhatched, ∞: some requests of the class never answered within the run"
            if unbounded
            else ""
        ),
        fontsize=10,
    )
    fig.tight_layout()
    _legend_right(fig, ax, solid_bars=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def fig_ablation(raw: dict[str, Any], path: Path) -> None:
    plt = _plt()
    f = raw.get("findings", {})
    groups = [(k, f[k]) for k in ("stressed_rate", "max_long_ratio") if f.get(k)]
    if not groups:
        return
    systems = ["horizon", *(a for a in ABLATIONS if any(f"{a}_attainment" in c for _, c in groups))]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(systems)
    for j, s in enumerate(systems):
        ys = []
        for _, c in groups:
            v = c.get("horizon") if s == "horizon" else c.get(f"{s}_attainment")
            ys.append(100 * (v or 0.0))
        xs = [i + (j - (len(systems) - 1) / 2) * width for i in range(len(groups))]
        bars = ax.bar(xs, ys, width, color=system_style(s)[0], label=s)
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
    labels = [
        f"{c['rate']:g} req/s" if k == "stressed_rate" else f"{c['long_ratio']:.0%} long-path"
        for k, c in groups
    ]
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(labels)
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(0, 110)
    ax.set_title(f"{_sim_tag(raw)} — ablation (cf. paper Fig. 11)", fontsize=10)
    fig.tight_layout()
    _legend_right(fig, ax)
    fig.savefig(path, dpi=120, bbox_inches="tight")
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
        f"{_sim_tag(raw)} — horizon control trace, {p['rate']:g} req/s, "
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
