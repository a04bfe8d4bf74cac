"""Why a text request waited at the thinker, from a real-pipeline driver report.

    python text_wait.py report.json[.gz]

Per way: SLO attainment under the report's targets; the thinker's step gaps (first 3 s of the
burst and whole run); per text request its wait at the thinker (stamped arrival to admission),
its slack left at admission, and what the thinker ran meanwhile; the stage timeline around the
text burst (`--timeline`).
"""

from __future__ import annotations

import gzip
import itertools
import json
import statistics
import sys
from typing import Any


def load(path: str) -> dict[str, Any]:
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        return json.load(f)


def main(path: str, timeline: bool) -> None:
    report = load(path)
    slo = report["slo_s"]
    print(f"SLO targets s: text-text {slo['text-text']:.3f}, text-speech {slo['text-speech']:.3f}")
    for way, run in report["ways"].items():
        reqs = run["requests"]
        names = {r["response_ids"][0]: f"{r['kind']}{r['idx']}" for r in reqs}

        def name(rid: str, names: dict[str, str] = names) -> str:
            return next((v for k, v in names.items() if rid.startswith(k)), "?")

        text = [r["first_text_s"] - r["sent_s"] for r in reqs if r["kind"] == "text"]
        audio = [r["first_audio_s"] - r["sent_s"] for r in reqs if r["kind"] == "speech"]
        met_t = sum(x <= slo["text-text"] for x in text)
        met_s = sum(x <= slo["text-speech"] for x in audio)
        steps = [e for e in run["trace"] if e["ev"] == "step"]
        th = [e for e in steps if e["stage"] == "thinker"]
        t0 = th[0]["t_ns"]
        early = [e for e in th if e["t_ns"] - t0 < 3e9]
        gaps = [(b["t_ns"] - a["t_ns"]) / 1e9 for a, b in itertools.pairwise(th)]
        early_gaps = [(b["t_ns"] - a["t_ns"]) / 1e9 for a, b in itertools.pairwise(early)]
        order = []
        admitted: dict[str, tuple[int, dict]] = {}
        for e in th:
            for n in e["new"]:
                if n["id"] not in admitted:
                    admitted[n["id"]] = (e["t_ns"], n)
                    order.append(name(n["id"])[0].upper())
        print(
            f"\n== {way}: text met {met_t}/{len(text)}, speech met {met_s}/{len(audio)}; "
            f"thinker admissions {''.join(order)}; preemptions "
            f"{sum(len(e['preempted']) for e in th)}; thinker steps in the first 3 s "
            f"{len(early)} (median gap {statistics.median(early_gaps):.3f} s), whole run median "
            f"gap {statistics.median(gaps):.3f} s, longest {max(gaps):.2f} s"
        )
        for rid, (t, n) in sorted(admitted.items(), key=lambda kv: kv[1][0]):
            stamp = n["stamp"]
            if not name(rid).startswith("text") or stamp is None:
                continue
            between = [e for e in th if stamp["arrival_ns"] <= e["t_ns"] < t]
            running = sorted({name(i) for e in between for i in e["ids"]})
            print(
                f"   {name(rid)}: waited {(t - stamp['arrival_ns']) / 1e9:5.2f} s, slack at "
                f"admission {(stamp['deadline_ns'] - t) / 1e9:+5.2f} s, thinker steps meanwhile "
                f"{len(between)}, running {running}"
            )
        if timeline and admitted:
            texts = [v for v in admitted.values() if name(v[1]["id"]).startswith("text")]
            if not texts or texts[0][1]["stamp"] is None:
                continue
            start = min(n["stamp"]["arrival_ns"] for _, n in texts)
            end = max(t for t, _ in texts)
            for e in steps:
                if start - 0.5e9 <= e["t_ns"] <= end + 0.1e9:
                    print(
                        f"   {(e['t_ns'] - start) / 1e9:+7.3f} {e['stage']:8} "
                        f"run={[name(i) for i in e['ids']]} new={[name(n['id']) for n in e['new']]}"
                    )


if __name__ == "__main__":
    main(sys.argv[1], "--timeline" in sys.argv[2:])
