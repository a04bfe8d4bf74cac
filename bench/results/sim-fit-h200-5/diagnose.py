"""The diagnosis behind this refit, in numbers: MiMo-Audio's thinker on the GPU (mimo-places-v1
step rows and request records, measured) beside the simulator's (SIMULATED, `record_steps`) on
the same requests, for one artifact.

    python bench/results/sim-fit-h200-5/diagnose.py ARTIFACT [ITEMS]

Per item: (1) thinker tokens a spoken answer decodes (records' shared_tokens against the
simulator's decode_len), (2) single-prompt prefill time beside the talker per padded length,
(3) decode rows, prefill and decode seconds over the run, the share of steps with every slot
taken (48), and the attainment (short / long path).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from horizonserve.runtime.calibrate.artifact import load_artifact
from horizonserve.runtime.calibrate.records import read_campaign, read_members, read_steps
from horizonserve.runtime.sim.engine import Simulator
from horizonserve.runtime.sim.fit import replay_of

RUN = Path("bench/results/h200-eval/mimo-places-v1")


def _rows(cols: list[str], rows: list[list]) -> list[dict]:
    return [dict(zip(cols, r, strict=True)) for r in rows]


def _prefill(rows: list[dict], buckets: list[int]) -> dict[int, float]:
    g: dict[int, list[float]] = {}
    for r in rows:
        single = r["downstream_active"] and r["prefill_batch"] == 1
        if single and r["prefill_sms"] == r["shared_sms"] == 132:
            n = next(b for b in buckets if b >= r["prefill_tokens"])
            g.setdefault(n, []).append(r["prefill_s"])
    return {n: 1e3 * statistics.median(v) for n, v in sorted(g.items()) if len(v) >= 20}


def _summary(rows: list[dict], full: int) -> str:
    dec = [r for r in rows if r["decode_batch"] > 0]
    pre = sum(r["prefill_s"] for r in rows)
    ds = sum(r["decode_s"] for r in rows)
    rows_mean = statistics.fmean(r["decode_batch"] for r in dec)
    at_full = sum(1 for r in rows if r["decode_batch"] + r["prefill_batch"] >= full) / len(rows)
    return (
        f"steps {len(rows)}, prefill {pre:.1f} s + decode {ds:.1f} s, mean decode rows "
        f"{rows_mean:.1f}, steps with every slot taken {100 * at_full:.1f} %"
    )


def main() -> None:
    art_path = sys.argv[1]
    keys = sys.argv[2].split(",") if len(sys.argv) > 2 else ["r8/horizon", "r12/horizon",
                                                            "r12/edf-mps"]  # fmt: skip
    art = load_artifact(art_path)
    cal = art.pipeline("mimo_audio")
    c = read_campaign(RUN)
    replay = replay_of(c, art)
    setup = replay.setup(cal)
    buckets = sorted(cal.shared.prefill_buckets or [])
    full = cal.shared.max_num_seqs
    print(f"artifact {art_path}: SIMULATED against measured ({RUN})")
    for key in keys:
        it = c.items[key]
        short_m, long_m = 100 * it.short_attainment, 100 * it.long_attainment
        print(f"\n== {key} (measured {100 * it.attainment:.1f} %: short {short_m:.1f} / "
              f"long {long_m:.1f})")  # fmt: skip
        sim = Simulator(setup, replay.trace(it.point), it.system,
                        seed=c.points[it.point].seed, record_steps=True)  # fmt: skip
        res = sim.run()
        reqs = {r.idx: r for r in sim.requests}
        recs = next(
            m["records"]
            for m in read_members(RUN / it.sessions[0] / "records.jsonl.gz")
            if m["item"] == it.item_ids[0]
        )
        longs = [r for r in recs if r["path"] == "long"]
        meas_tok = statistics.fmean(r["shared_tokens"] or 0 for r in longs)
        sim_tok = statistics.fmean(reqs[int(r["id"].rsplit("-", 1)[1])].decode_len for r in longs)
        print(f"  thinker tokens per spoken answer: measured {meas_tok:.1f}, "
              f"SIMULATED {sim_tok:.1f}")  # fmt: skip
        m = read_steps(c, key)[0]
        mrows = _rows(m["columns"], m["rows"])
        assert res.steps is not None
        srows = _rows(res.steps["columns"], res.steps["rows"])
        mp, sp = _prefill(mrows, buckets), _prefill(srows, buckets)
        print("  single-prompt prefill beside the talker, p50 ms by padded length:")
        print("    " + "  ".join(f"{n}: {mp[n]:.1f} / {sp.get(n, float('nan')):.1f}" for n in mp)
              + "  (measured / SIMULATED)")  # fmt: skip
        print(f"  measured:  {_summary(mrows, full)}")
        print(f"  SIMULATED: {_summary(srows, full)}; preemptions "
              f"{res.stats['preemptions']:.0f}")  # fmt: skip
        short = res.short_mask()
        a_s, a_l = 100 * res.attainment(short), 100 * res.attainment(~short)
        print(f"  SIMULATED attainment {100 * res.attainment():.1f} %: short {a_s:.1f} / "
              f"long {a_l:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
