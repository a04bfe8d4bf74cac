"""Why the simulator over-predicts HorizonServe's speech path on Qwen2.5-Omni (SIMULATED beside
measured, the same requests, each item under the controller its session ran).

    python bench/results/sim-fit-talker/diagnose.py [RUN] [ITEMS]

Per item: the long path's attainment; the talker's pace, seconds of streaming per second of
audio (measured: each answered stream's last chunk minus its first over its audio length,
p50; SIMULATED: the fluid talker's mean step time over the run times its steps per audio
second); and how often the split reserved the GPU for the talker (the shared stage on 16 SMs
or fewer): the share of the shared stage's co-running steps, measured from the step rows and
SIMULATED from the simulator's count of reserved iterations.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from horizonserve.runtime.calibrate.artifact import load_artifact
from horizonserve.runtime.calibrate.records import (
    Campaign,
    read_campaign,
    read_members,
    read_steps,
)
from horizonserve.runtime.sim.engine import Simulator
from horizonserve.runtime.sim.fit import replay_of
from horizonserve.runtime.workload import Trace

ARTIFACT = "runtime/data/calibration/h200-fitted.json"
RESERVED_SMS = 16  # the calibrated reservation leaves the shared stage this many SMs


def _measured_pace(run: Path, c: Campaign, key: str, trace: Trace) -> tuple[float, int, int]:
    it = c.items[key]
    recs = next(
        m["records"]
        for m in read_members(run / it.sessions[0] / "records.jsonl.gz")
        if m["item"] == it.item_ids[0]
    )
    longs = [r for r in recs if r["path"] == "long"]
    pace = []
    for r in longs:
        audio = float(trace.output_audio_s[int(r["id"].rsplit("-", 1)[1])])
        if r["done_s"] is not None and r["first_response_s"] is not None and audio > 0:
            pace.append((r["done_s"] - r["first_response_s"]) / audio)
    answered = sum(r["first_response_s"] is not None for r in longs)
    return statistics.median(pace), answered, len(longs)


def _measured_reserved(c: Campaign, key: str) -> float:
    m = read_steps(c, key)[0]
    ix = {k: i for i, k in enumerate(m["columns"])}
    co = [r for r in m["rows"] if r[ix["downstream_active"]]]
    return sum(r[ix["shared_sms"]] <= RESERVED_SMS for r in co) / len(co)


def main() -> None:
    run = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/h200-eval/qwen-ship-v2")
    keys = (sys.argv[2] if len(sys.argv) > 2 else "r8/horizon,r10/horizon,r6-l60/horizon,"
            "r8/edf-mps,r10/edf-mps,r6-l60/edf-mps").split(",")  # fmt: skip
    c = read_campaign(run)
    art = load_artifact(ARTIFACT)
    cal = art.pipeline(c.pipeline)
    replay = replay_of(c, art)
    talker = cal.downstream[0]
    print(f"{run} against {ARTIFACT}: measured / SIMULATED, the same requests")
    print(f"{'item':<18}{'long path %':>16}{'talker s per audio-s':>24}{'reserved steps %':>20}")
    for key in keys:
        it = c.items[key]
        trace = replay.trace(it.point)
        pace, answered, n = _measured_pace(run, c, key, trace)
        sim = Simulator(replay.setup(cal, key), trace, it.system, seed=c.points[it.point].seed)
        res = sim.run()
        stage = sim.stages[0]
        sim_pace = stage.busy_time / stage.v * talker.work_per_audio_second
        long_sim = 100 * res.attainment(~res.short_mask())
        assert it.long_attainment is not None
        reserved = 100 * _measured_reserved(c, key)
        print(
            f"{key:<18}{100 * it.long_attainment:>8.1f} / {long_sim:<5.1f}"
            f"{pace:>13.3f} / {sim_pace:<8.3f}"
            f"{reserved:>11.1f} / {100 * res.stats['reserved_frac']:<6.1f}"
            f"  ({answered} of {n} long-path requests answered by the cut)"
        )


if __name__ == "__main__":
    main()
