"""MiMo-Audio's thinker as the reference engine ran it, checked against the measured campaign
bench/results/h200-eval/mimo-places-v1 (SIMULATED against measured): the thinker decodes each
answer's text tokens, spoken answers included, and its prefill call costs a fixed part plus a
per-token part (`sim.fit.prefill_line`), both read from the campaign's step rows."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import pytest

from horizonserve.runtime.artifact import load_artifact, load_packaged
from horizonserve.runtime.calibrate.fit import (
    campaign_steps,
    prefill_line,
    reference_engine,
    replay_of,
)
from horizonserve.runtime.calibrate.records import read_campaign, read_members
from horizonserve.runtime.sim.engine import Simulator, simulate
from horizonserve.runtime.sim.model import SharedCost, Sharing

ROOT = Path(__file__).resolve().parents[3]
PLACES = ROOT / "bench/results/h200-eval/mimo-places-v1"
PIPE = "mimo_audio"


def test_the_reference_thinker_decodes_the_answers_text_tokens() -> None:
    """On the GPU each spoken answer's thinker ran exactly the trace's `output_tokens` (0.3 s of
    speech per token: 3.3 a second), not the 6.25 tokens a second of speech the deploy path's
    model decodes; the reference entry and the shipped one decode the same."""
    c = read_campaign(PLACES)
    it = c.items["r12/horizon"]
    member = next(
        m
        for m in read_members(PLACES / it.sessions[0] / "records.jsonl.gz")
        if m["item"] == it.item_ids[0]
    )
    art = load_artifact()
    replay = replay_of(c, art)
    trace = replay.trace("r12")
    finished = [r for r in member["records"] if r["path"] == "long" and r["done_s"] is not None]
    assert len(finished) > 200
    for r in finished:
        i = int(r["id"].rsplit("-", 1)[1])
        assert r["shared_tokens"] == max(1, int(trace.output_tokens[i]))
    measured = load_packaged("h200-measured.json").pipeline(PIPE)
    assert measured.shared.decode_tokens_per_output_audio_second == 6.25  # the deploy path's
    ref = reference_engine(measured)
    assert ref.shared.decode_tokens_per_output_audio_second == 0.0
    # The simulator then decodes what the GPU decoded (the shipped entry, fitted before this
    # rule, still carries 6.25: sim-fit-h200-5/README.md).
    shared = art.pipeline(PIPE).shared.model_copy(
        update={"decode_tokens_per_output_audio_second": 0.0}
    )
    cal = art.pipeline(PIPE).model_copy(update={"shared": shared})
    sim = Simulator(replay.setup(cal), trace, "horizon", seed=c.points["r12"].seed)
    sim.run()
    for req in sim.requests:
        if req.long_path:
            assert req.decode_len == max(0, int(trace.output_tokens[req.idx]))


def test_prefill_line_reads_back_the_line_the_simulator_ran() -> None:
    """`prefill_line` on the simulator's own step rows (`record_steps`) returns the fixed cost
    and the slope it charged, through the co-run factors of a partition and of MPS."""
    art = load_artifact()
    c = read_campaign(PLACES)
    replay = replay_of(c, art)
    base = art.pipeline(PIPE)
    tok = base.shared.prefill_token_s
    truth = base.model_copy(
        update={
            "shared": base.shared.model_copy(
                update={
                    "prefill_call_s": 0.011,
                    "prefill_token_s": tok.model_copy(
                        update={"values": [v * 0.4 for v in tok.values]}
                    ),
                }
            )
        }
    )
    setup = dataclasses.replace(replay.setup(truth), cal=truth)
    steps = []
    for system in ("horizon", "edf-mps", "fcfs"):
        r = simulate(setup, replay.trace("r8"), system, seed=1, record_steps=True)
        assert r.steps is not None
        steps.append((system, r.steps))
    line = prefill_line(base, steps)
    assert line is not None
    call, scale, n = line
    assert n > 500
    assert call == pytest.approx(0.011, abs=2e-4)
    assert scale == pytest.approx(0.4, rel=0.02)


def test_the_prefill_line_of_8_and_10_req_s_predicts_12_req_s() -> None:
    """`prefill_line` read from mimo-reserve-v1's 8 and 10 req/s step rows (the fit points)
    predicts the GPU's single-prompt prefills beside the talker under MPS at 12 req/s
    (mimo-places-v1, measured later) within 40 % per padded length (32-768 tokens); the
    shipped entry (no fixed cost, the per-token cost of one 2048-token prompt doubled by an
    earlier fit) charges 0.15x the GPU's time at 32 tokens and 1.9x at 768."""
    base = reference_engine(load_packaged("h200-measured.json").pipeline(PIPE))
    reserve = read_campaign(ROOT / "bench/results/h200-eval/mimo-reserve-v1")
    keys = [k for k in reserve.items if reserve.items[k].point in ("r8", "r10")]
    line = prefill_line(base, campaign_steps(reserve, keys))
    assert line is not None
    call, scale, _n = line
    tok = base.shared.prefill_token_s.at(132)
    fp = SharedCost(base).corun_factors(132, Sharing.MPS)[1]
    c = read_campaign(PLACES)
    buckets = sorted(base.shared.prefill_buckets or [])
    groups: dict[int, list[float]] = {}
    for _system, m in campaign_steps(c, ["r12/horizon", "r12/edf-mps"]):
        ix = {k: i for i, k in enumerate(m["columns"])}
        for r in m["rows"]:
            ok = r[ix["downstream_active"]] and r[ix["prefill_batch"]] == 1
            if ok and r[ix["shared_sms"]] == r[ix["prefill_sms"]] == 132:
                n = next(b for b in buckets if b >= r[ix["prefill_tokens"]])
                groups.setdefault(n, []).append(r[ix["prefill_s"]])
    shipped = SharedCost(load_artifact().pipeline(PIPE))
    checked, old = 0, []
    for n, ys in sorted(groups.items()):
        if len(ys) < 20:
            continue
        gpu = statistics.median(ys)
        assert 0.7 <= fp * (call + scale * tok * n) / gpu <= 1.4, n
        old.append(shipped.iteration_parts(132, 0, n, 0, True, Sharing.MPS)[0] / gpu)
        checked += 1
    assert checked >= 5
    assert old[0] < 0.2 and old[-1] > 1.7  # the shipped entry: 32 and 768 tokens
