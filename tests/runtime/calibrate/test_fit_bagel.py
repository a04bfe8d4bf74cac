"""BAGEL on the simulated H200 as the reference engine ran it (`sim.fit.reference_engine`), and
its fit to the measured campaign bench/results/h200-eval/bagel-v2 (SIMULATED against
measured): the partitioned levels pay no MPS excess, the engine's limits and step rules, the
step-row constants, and the shipped default reproducing its recorded fit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from horizonserve.runtime.artifact import (
    CalibrationArtifact,
    PipelineCalibration,
    load_artifact,
)
from horizonserve.runtime.calibrate.fit import (
    REFERENCE,
    Replay,
    apply_factors,
    campaign_steps,
    errors_pp,
    fit,
    mae,
    reference_engine,
    replay_of,
    step_constants,
)
from horizonserve.runtime.calibrate.records import (
    Campaign,
    CampaignPoint,
    MeasuredItem,
    read_campaign,
)
from horizonserve.runtime.engine.reference.ar import prefill_buckets
from horizonserve.runtime.engine.reference.presets import get_preset
from horizonserve.runtime.sim.engine import simulate
from horizonserve.runtime.sim.model import SharedCost, Sharing
from horizonserve.runtime.sim.request import SimRequest
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.sim.shared import Batch, SharedStage
from horizonserve.runtime.workload import Trace, generate, load_workload, mix_weights

ROOT = Path(__file__).resolve().parents[3]
# The earlier campaign (its plan recorded 51 / 76 DiT steps to the first image) and the one the
# shipped entry is fitted to (today's engine layout).
CAMPAIGN = ROOT / "bench/results/h200-eval/bagel-v2"
FITTED = ROOT / "bench/results/h200-eval/bagel-v3"
PIPE = "bagel"


@pytest.fixture(scope="module")
def art() -> CalibrationArtifact:
    return load_artifact()  # the shipped default: BAGEL fitted to the campaign


@pytest.fixture(scope="module")
def cal(art: CalibrationArtifact) -> PipelineCalibration:
    return art.pipeline(PIPE)


@pytest.fixture(scope="module")
def campaign() -> Campaign:
    return read_campaign(CAMPAIGN)


@pytest.fixture(scope="module")
def fitted_campaign() -> Campaign:
    return read_campaign(FITTED)


def _with(cal: PipelineCalibration, **sharing: float) -> PipelineCalibration:
    return cal.model_copy(update={"sharing": cal.sharing.model_copy(update=sharing)})


def _trace(rate: float, dur: float, seed: int = 1) -> Trace:
    wl = load_workload(PIPE)
    setup = SimSetup.load(PIPE)
    mix = mix_weights(wl, setup.long_classes, None)
    return generate(wl, mix, rate=rate, duration_s=dur, seed=seed)


def test_partitioned_levels_pay_no_mps_excess(cal: PipelineCalibration) -> None:
    """On its Green-Context share (a ladder level or the 16-SM reservation) the thinker pays the
    partition's co-run factors only: the MPS excess leaves its steps, and a whole HorizonServe
    run that visits the reservation, unchanged. Only a boosted prefill, which overlaps the
    DiT's SMs, pays a share of it."""
    hot = _with(cal, mps_shared_excess=40.0, mps_decode_rows_frac=1.0)
    reserve = cal.ladder.s_reserve
    for sms in (reserve, *cal.ladder.levels):
        parts = SharedCost(cal).iteration_parts(sms, 8, 512, 4000, True, Sharing.PARTITION)
        assert SharedCost(hot).iteration_parts(sms, 8, 512, 4000, True, Sharing.PARTITION) == parts
    mps = SharedCost(cal).iteration_parts(132, 8, 512, 4000, True, Sharing.MPS)
    assert SharedCost(hot).iteration_parts(132, 8, 512, 4000, True, Sharing.MPS)[1] > mps[1]
    # End to end, with the boost's share of the excess at 0: the same run to the request.
    tr = _trace(2.0, 40.0)
    runs = []
    for c in (_with(cal, boost_prefill_excess=0.0), _with(hot, boost_prefill_excess=0.0)):
        setup = dataclasses.replace(SimSetup.load(PIPE), cal=c)
        runs.append(simulate(setup, tr, "horizon", seed=1))
    assert runs[0].stats["reserved_frac"] > 0.3  # the reservation carried most steps
    np.testing.assert_array_equal(runs[0].latency, runs[1].latency)


def test_the_bagel_entry_is_the_reference_engine(cal: PipelineCalibration) -> None:
    """The shipped entry carries the limits and step rules the campaign's engine ran, and the
    simulator keeps them (no deploy file re-read: the reference thinker does not follow
    BAGEL's deploy file)."""
    ref = get_preset("full", "tuned")
    sh, dit = cal.shared, cal.downstream[0]
    assert cal.deploy_profile is None and cal.fit is not None and cal.fit.engine == REFERENCE
    assert (sh.max_num_seqs, sh.max_num_batched_tokens) == (48, 8192)
    assert sh.max_num_seqs == ref.thinker_limits.max_batch
    assert sh.graph_batch_sizes == [1, 2, 4, 8, 16, 32, 48]
    assert sh.tokens_per_image == ref.tokens_per_image == 256
    assert sh.prefill_buckets == list(prefill_buckets(ref.thinker_limits.max_len))
    assert sh.prefill_then_decode and sh.prefill_call_s > 0
    assert (dit.max_batch, dit.work_fixed, dit.batch_frac) == (ref.dit_max_batch, 20.0, 0.9)
    assert ref.dit.steps == 20
    loaded = SimSetup.load(PIPE).cal
    assert (loaded.shared.max_num_seqs, loaded.downstream[0].max_batch) == (48, 4)
    # reference_engine is idempotent and keeps the costs
    again = reference_engine(cal)
    assert again.shared == cal.shared and again.sharing == cal.sharing


def test_the_campaign_thinker_ran_more_sequences_than_the_bagel_deploy_file(
    campaign: Campaign,
) -> None:
    """Why the entry takes the thinker's limits from the preset: BAGEL's deploy file says 12
    sequences, the engine ran up to 41 at once (MPS, r2)."""
    most = 0
    for _system, m in campaign_steps(campaign, ["r2/mps"]):
        ix = {c: i for i, c in enumerate(m["columns"])}
        most = max(most, *(r[ix["decode_batch"]] + r[ix["prefill_batch"]] for r in m["rows"]))
    assert 12 < most <= 48


def test_prefill_is_padded_and_its_first_token_comes_before_the_decode(
    cal: PipelineCalibration,
) -> None:
    """The reference engine pads a batch's prompts to the longest, rounded up to a bucket,
    and emits a prompt's first token when its prefill call ends (a decode step follows)."""
    stage = SharedStage(cal.shared)
    reqs = [SimRequest(i, 0, 0.0, n, 5, 5, False, 0.0, 0) for i, n in enumerate((30, 270))]
    b = Batch(chunks=[(r, r.prompt) for r in reqs], prefill_tokens=300)
    assert stage._pad(b) == 2 * 512
    cost = SharedCost(cal)
    pre, dec = cost.iteration_parts(132, 0, 512, 0, False, Sharing.PARTITION)
    assert dec == 0.0  # no running sequence: no decode call
    assert pre == pytest.approx(cal.shared.prefill_call_s + 512 * cost.prefill_token_s(132))
    # One text prompt alone: its TTFT is the prefill call, not the iteration.
    tr = Trace(
        classes=("text-chat",),
        cls=np.array([0]),
        arrival=np.array([0.0]),
        text_tokens=np.array([100]),
        audio_s=np.array([0.0]),
        images=np.array([0]),
        video_s=np.array([0.0]),
        output_tokens=np.array([50]),
        output_audio_s=np.array([0.0]),
        duration_s=1.0,
    )
    r = simulate(SimSetup.load(PIPE), tr, "priority")
    first = cal.shared.prefill_call_s + 128 * cost.prefill_token_s(132)
    assert r.latency[0] == pytest.approx(first, rel=1e-6, abs=1e-5)


def test_step_constants_recover_what_the_simulator_ran(cal: PipelineCalibration) -> None:
    """The step-row estimators read back the constants from the simulator's own step trace
    (`record_steps`): exactly for the prefill call and the boost's share of the MPS excess,
    within the context term's bias for the MPS decode growth."""
    truth = _with(
        cal.model_copy(update={"shared": cal.shared.model_copy(update={"prefill_call_s": 0.02})}),
        boost_prefill_excess=0.4,
        mps_decode_rows_frac=0.05,
    )
    setup = dataclasses.replace(SimSetup.load(PIPE), cal=truth)
    tr = _trace(2.0, 40.0)
    steps = []
    for system in ("horizon", "mps"):
        r = simulate(setup, tr, system, seed=1, record_steps=True)
        assert r.steps is not None
        steps.append((system, r.steps))
    k = step_constants(truth, steps)
    assert k.call_steps > 10 and k.boost_steps > 10 and k.mps_steps > 100
    assert k.prefill_call_s == pytest.approx(0.02, abs=1e-4)
    assert k.boost_prefill_excess == pytest.approx(0.4, abs=0.01)
    assert k.mps_decode_rows_frac == pytest.approx(0.05, rel=0.25)


def test_fit_recovers_known_factors_from_synthetic_bagel_records(
    art: CalibrationArtifact,
) -> None:
    """Records the simulator made under known contention factors: the fit finds them back
    (a load where neither item saturates: Priority's images and MPS's text both respond;
    on the shipped entry MPS's text stops responding above a shared_mps of about 1.5)."""
    truth = {"down_timeslice": 0.8, "shared_mps": 1.15}
    base = art.pipeline(PIPE)
    wl = load_workload(PIPE)
    setup = SimSetup.load(PIPE, art)
    mix = mix_weights(wl, setup.long_classes, None)
    n = len(generate(wl, mix, rate=1.5, duration_s=40.0, seed=3))
    points = {"a": CampaignPoint("a", 1.5, None, 3, 40.0, n)}
    skeleton = Campaign("synthetic", PIPE, setup.targets(), 5.0, "-", points, {})
    keys = ["a/priority", "a/mps"]
    stub = {k: MeasuredItem(*k.split("/"), 0.0, None, None, (0.0,), ("s",)) for k in keys}
    replay = Replay(dataclasses.replace(skeleton, items=stub), art, None)
    measured = replay.attainment(apply_factors(base, truth), keys)
    items = {
        k: MeasuredItem(*k.split("/"), a, None, None, (a,), ("s",)) for k, a in measured.items()
    }
    replay.campaign = dataclasses.replace(skeleton, items=items)
    start = mae(errors_pp(replay.attainment(base, keys), replay.campaign))
    assert start > 3.0
    res = fit(replay, base, keys, names=list(truth), max_evals=30)
    assert mae(res.residuals(replay.campaign)) <= 1.0, res.factors
    for name, value in truth.items():
        assert value / 1.15 <= res.factors[name] <= value * 1.15, res.factors


def test_shipped_bagel_default_reproduces_its_recorded_fit(
    art: CalibrationArtifact, fitted_campaign: Campaign
) -> None:
    """The default artifact's BAGEL entry: the replay its fit used gives the residuals its
    provenance records, inside the targets (≤ 3 pp in-sample, ≤ 5 pp held out), and the fit
    never saw the held-out points."""
    campaign = fitted_campaign
    f = art.pipeline(PIPE).fit
    assert f is not None and f.runs == [str(FITTED.relative_to(ROOT))]
    assert f.mae_in_pp <= 3.0 and f.mae_out_pp is not None and f.mae_out_pp <= 5.0
    fit_points = {campaign.items[k].point for k in f.fit_items}
    assert fit_points == {"r2", "r2-l60"}
    assert not {campaign.items[k].point for k in f.holdout_items} & fit_points
    keys = [*f.fit_items, *f.holdout_items]
    assert sorted(keys) == sorted(campaign.items)  # every measured item is scored
    err = errors_pp(replay_of(campaign, art).attainment(art.pipeline(PIPE), keys), campaign)
    for k in keys:
        assert err[k] == pytest.approx(f.residuals_pp[k], abs=0.01), k
    assert mae(err, f.holdout_items) == pytest.approx(f.mae_out_pp, abs=0.01)


def test_replay_uses_the_campaigns_slo_table(art: CalibrationArtifact, campaign: Campaign) -> None:
    """The replay scores against the plan's SLO table and runs the controller on the class
    profiles the plan recorded (51 / 76 DiT steps to the first image, not the entry's 20)."""
    setup = replay_of(campaign, art).setup(art.pipeline(PIPE))
    assert setup.targets() == pytest.approx(campaign.targets_s)
    assert setup.targets()["text-to-image"] == pytest.approx(15.75295)
    steps = {c.name: c.profile.downstream_steps_to_first_response for c in setup.slo.classes}
    assert steps == {"text-chat": 0, "image-understanding": 0, "text-to-image": 51,
                     "image-editing": 76}  # fmt: skip
