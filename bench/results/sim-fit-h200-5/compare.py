"""Simulated − measured attainment per item (pp) on the four MiMo-Audio campaigns for one
artifact (SIMULATED vs measured), replayed as `horizonserve calibrate fit` replays a campaign
(`sim.fit.replay_of`: the plan's SLO table, control and class table; one seed, the point's).

    python bench/results/sim-fit-h200-5/compare.py ARTIFACT [DECODE_TOKENS_PER_AUDIO_S]

With the second argument the MiMo-Audio entry's decode_tokens_per_output_audio_second is
replaced first (0: the thinker decodes the answer's text tokens, as the reference engine ran)."""

import sys

from horizonserve.runtime.calibrate.artifact import load_artifact
from horizonserve.runtime.calibrate.records import read_campaign
from horizonserve.runtime.sim.fit import replay_of

art = load_artifact(sys.argv[1])
cal = art.pipeline("mimo_audio")
if len(sys.argv) > 2:
    sh = cal.shared.model_copy(update={"decode_tokens_per_output_audio_second": float(sys.argv[2])})
    cal = cal.model_copy(update={"shared": sh})
errs = []
for name in ("mimo-v1", "mimo-r8-v1", "mimo-reserve-v1", "mimo-places-v1"):
    c = read_campaign(f"bench/results/h200-eval/{name}")
    sim = replay_of(c, art).attainment(cal, list(c.items))
    for k in sorted(c.items):
        m = 100 * c.items[k].attainment
        e = 100 * sim[k] - m
        errs.append(abs(e))
        print(f"{name:16} {k:14} measured {m:5.1f}  SIMULATED {100 * sim[k]:5.1f}  {e:+6.1f} pp")
print(f"mean |error| {sum(errs) / len(errs):.2f} pp over {len(errs)} rows, largest {max(errs):.1f}")
