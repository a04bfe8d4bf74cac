"""`horizonserve calibrate fit`: the fit recovers known factors from synthetic records, reads
the committed H200 campaign the way its report does, and its artifact round-trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from horizonserve.runtime.artifact import load_artifact, load_packaged
from horizonserve.runtime.calibrate.fit import (
    FACTORS,
    Replay,
    apply_factors,
    compass_search,
    errors_pp,
    fit,
    items_by_run,
    mae,
    replay_of,
    solo_classes,
    solo_error_pct,
)
from horizonserve.runtime.calibrate.records import (
    Campaign,
    CampaignPoint,
    MeasuredItem,
    read_campaign,
)
from horizonserve.runtime.cli import main
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.sim.solo import measure_solo_p95
from horizonserve.runtime.workload import generate, load_workload, mix_weights

ROOT = Path(__file__).resolve().parents[3]
CAMPAIGN = ROOT / "bench/results/h200-eval/qwen2_5_omni-2"
PIPE = "qwen2_5_omni"


def _synthetic_campaign(truth: dict[str, float]) -> tuple[Campaign, Replay]:
    """Records made by the simulator itself under `truth`: what a perfect model would fit."""
    art = load_packaged("h200-measured.json")
    setup = SimSetup.load(PIPE, art)
    targets = setup.targets()
    wl = load_workload(PIPE)
    points = {}
    for pid, rate in (("a", 10.0),):
        mix = mix_weights(wl, setup.long_classes, None)
        n = len(generate(wl, mix, rate=rate, duration_s=24.0, seed=3))
        points[pid] = CampaignPoint(pid, rate, None, 3, 24.0, n)
    skeleton = Campaign("synthetic", PIPE, targets, 5.0, "h200-measured.json", points, {})
    replay = Replay(skeleton, art, "tuned")
    keys = [f"{p}/{s}" for p in points for s in ("fcfs", "edf", "mps", "edf-mps")]
    stub = {k: MeasuredItem(*k.split("/"), 0.0, None, None, (0.0,), ("s",)) for k in keys}
    replay.campaign = Campaign(**{**vars(skeleton), "items": stub})
    true_cal = apply_factors(art.pipeline(PIPE), truth)
    measured = replay.attainment(true_cal, keys)
    items = {
        k: MeasuredItem(*k.split("/"), a, None, None, (a,), ("synthetic",))
        for k, a in measured.items()
    }
    replay.campaign = Campaign(**{**vars(skeleton), "items": items})
    return replay.campaign, replay


def test_fit_recovers_known_factors_from_synthetic_records() -> None:
    truth = {"down_mps": 1.8, "down_timeslice": 1.5}
    campaign, replay = _synthetic_campaign(truth)
    base = load_packaged("h200-measured.json").pipeline(PIPE)
    start = mae(errors_pp(replay.attainment(base, list(campaign.items)), campaign))
    assert start > 3.0  # the base is visibly wrong on these records
    res = fit(replay, base, list(campaign.items), names=list(truth), max_evals=40)
    err = mae(res.residuals(campaign))
    assert err <= 0.5, (res.factors, err)
    for name, value in truth.items():  # piecewise-constant objective: close, not exact
        assert value / 1.25 <= res.factors[name] <= value * 1.25, res.factors


def test_the_solo_term_scores_simulated_against_measured_solo_latency() -> None:
    """`--solo-weight`: zero where the entry's solo latency is the measured one, negative
    where a factor makes prefill cheaper than measured; the default classes are those with
    enough solo samples (every class when the entry records no counts)."""
    _campaign, replay = _synthetic_campaign({"down_mps": 1.8})
    base = load_packaged("h200-measured.json").pipeline(PIPE)
    p95 = measure_solo_p95(replay.setup(base), load_workload(PIPE), seed=0, n=200)
    cal = base.model_copy(update={"solo_p95_s": p95, "solo_samples": {}})
    text = [k for k in p95 if k.endswith("-text")]
    assert solo_classes(cal) == sorted(p95)
    counted = cal.model_copy(update={"solo_samples": {k: 20 if k in text else 6 for k in p95}})
    assert solo_classes(counted) == sorted(text)
    assert all(abs(v) < 1e-9 for v in solo_error_pct(replay, cal, text).values())
    cheap = apply_factors(cal, {"shared_prefill": 0.5})
    err = solo_error_pct(replay, cheap, text)
    assert set(err) == set(text) and all(v < -5.0 for v in err.values()), err


def test_compass_search_stays_in_bounds_and_finds_a_quadratic_minimum() -> None:
    target = {"down_mps": 3.0, "shared_full": 0.0}

    def f(x: dict[str, float]) -> float:
        return (x["down_mps"] - target["down_mps"]) ** 2 + x["shared_full"] ** 2

    x, best, hist = compass_search(f, list(target), {"down_mps": 1.0, "shared_full": 1.0})
    assert abs(x["down_mps"] - 3.0) < 0.1 and x["shared_full"] == 0.0 and best < 0.01
    for z, _v in hist:
        for k, v in z.items():
            assert FACTORS[k].lo <= v <= FACTORS[k].hi


def test_campaign_reader_matches_the_report() -> None:
    """The committed campaign: later sessions replace earlier ones only on --redo, and the
    attainment recomputed from the records equals the report's (results.json)."""
    c = read_campaign(CAMPAIGN)
    report = json.loads((CAMPAIGN / "results.json").read_text())["points"]
    assert len(c.items) == sum(len(v) for v in report.values()) == 22
    for it in c.items.values():
        assert it.attainment == pytest.approx(report[it.point][it.system]["attainment"])
    assert c.items["r8/horizon"].reps == pytest.approx((0.8603, 0.8646), abs=1e-4)
    assert "r6/fcfs/rep1 (s0 → s3)" in c.superseded
    late = read_campaign(CAMPAIGN, warmup_s=10.0)
    assert late.items["r8/mps"].attainment != c.items["r8/mps"].attainment


def test_fit_command_writes_a_versioned_artifact_with_provenance(tmp_path: Path) -> None:
    out = tmp_path / "fitted.json"
    argv = ["calibrate", "fit", "--records", str(CAMPAIGN), "--out", str(out),
            "--fit-points", "r6", "--holdout-points", "r6-l60", "--factors", "down_partition",
            "--max-evals", "6"]  # fmt: skip
    assert main(argv) == 0
    art = load_artifact(out)
    p = art.pipeline(PIPE)
    assert p.fit is not None and p.deploy_profile == "tuned"
    assert p.fit.runs == [str(CAMPAIGN)] and set(p.fit.factors) == {"down_partition"}
    assert set(p.fit.residuals_pp) == set(p.fit.fit_items) | set(p.fit.holdout_items)
    assert all(k.startswith("r6/") for k in p.fit.fit_items)
    assert p.fit.mae_out_pp is not None and p.fit.largest_miss.split()[0] in p.fit.residuals_pp
    assert art.source.startswith("measured on NVIDIA H200")  # still a GPU calibration ...
    assert "fitted by `horizonserve calibrate fit`" in art.source  # ... with fitted factors
    table = json.loads((tmp_path / "fitted.fit.json").read_text())["items"]
    assert {r["set"] for r in table} == {"fit", "holdout"}
    assert main([*argv[:-4], "--holdout-points", "r99"]) == 2  # unknown point: one line


@pytest.mark.parametrize(("pipeline", "held_out"), [(PIPE, True), ("mimo_audio", False)])
def test_shipped_default_reproduces_its_recorded_fit(pipeline: str, held_out: bool) -> None:
    """The default artifact is the fitted one: replaying the campaign on it gives the residuals
    its provenance records, inside the targets (≤ 3 pp in-sample, ≤ 5 pp held out; MiMo-Audio's
    fit saw every point of its campaign, and its held-out checks are the next test)."""
    art = load_artifact()
    fit_ = art.pipeline(pipeline).fit
    assert fit_ is not None and fit_.mae_in_pp <= 3.0
    assert bool(fit_.holdout_items) is held_out
    if held_out:
        assert fit_.mae_out_pp is not None and fit_.mae_out_pp <= 5.0
    for run, keys in items_by_run(fit_).items():
        campaign = read_campaign(ROOT / run, warmup_s=fit_.warmup_s)
        replay = replay_of(campaign, art)  # as the fit replayed it (its engine, its limits)
        err = errors_pp(replay.attainment(art.pipeline(pipeline), list(keys.values())), campaign)
        for record, item in keys.items():
            assert err[item] == pytest.approx(fit_.residuals_pp[record], abs=0.01), record
    assert load_artifact("estimate").source != art.source  # the paper estimate, one name away


@pytest.mark.parametrize(
    ("folder", "keys"),
    [
        ("mimo-v1", ["r5/horizon", "r6/horizon", "r5/edf-mps", "r6/edf-mps"]),
        ("mimo-r8-v1", ["r8/horizon"]),
    ],
)
def test_mimo_audio_predicts_the_campaigns_its_fit_never_saw(folder: str, keys: list[str]) -> None:
    """MiMo-Audio's entry was fitted to mimo-reserve-v1 (8 and 10 req/s, every system the GPU
    ran there, the time-sliced ones included). mimo-v1 (5 and 6 req/s) and mimo-r8-v1's
    HorizonServe (8 req/s, as it ran before the reservation rule changed) are points it never
    saw: each is predicted within the 5 pp out-of-sample target."""
    art = load_artifact()
    assert art.pipeline("mimo_audio").fit.runs == ["bench/results/h200-eval/mimo-reserve-v1"]
    campaign = read_campaign(ROOT / "bench/results/h200-eval" / folder, warmup_s=0.0)
    replay = replay_of(campaign, art)
    err = errors_pp(replay.attainment(art.pipeline("mimo_audio"), keys), campaign)
    assert set(err) == set(keys)
    assert max(abs(e) for e in err.values()) <= 5.0, err


def test_a_campaign_of_another_deploy_profile_is_replayed_with_its_limits() -> None:
    """The stock campaign (the vLLM-Omni files as shipped: an eager thinker of 16 slots, one
    code2wav slot fed whole answers) against an entry fitted to tuned campaigns: the replay
    takes the stock limits, keeps the fitted costs and says so; a tuned campaign's replay is
    the fit's own, limits untouched and no caveat."""
    art = load_artifact()
    stock = read_campaign(ROOT / "bench/results/h200-eval/qwen-stock-v1", warmup_s=0.0)
    assert stock.profile == "stock" and art.pipeline(PIPE).fit.deploy_profile == "tuned"
    replay = replay_of(stock, art)
    assert replay.limits_profile == "stock"
    assert "'stock'" in replay.caveat and "'tuned'" in replay.caveat
    cal = replay.setup(art.pipeline(PIPE)).cal
    assert cal.shared.max_num_seqs == 16 and cal.shared.graph_batch_sizes is None
    assert {d.name: d.max_batch for d in cal.downstream} == {"talker": 4, "code2wav": 1}
    tuned = read_campaign(ROOT / "bench/results/h200-eval/qwen-ship-v2", warmup_s=0.0)
    same = replay_of(tuned, art)
    assert same.limits_profile is None and same.caveat is None
    fitted = art.pipeline(PIPE)
    assert same.setup(fitted).cal.shared.max_num_seqs == fitted.shared.max_num_seqs != 16
    # The stock limits alone move the prediction towards the GPU: the speech path's first
    # audio waits for whole answers (measured: 0 % speech for every system at 1-2 req/s).
    sim = replay.attainment(fitted, ["r2/edf-mps"])["r2/edf-mps"]
    as_tuned = Replay(stock, art, None, recorded_classes=True).attainment(fitted, ["r2/edf-mps"])
    assert sim < as_tuned["r2/edf-mps"] - 0.2


def test_a_fit_of_several_runs_names_each_item_with_its_run() -> None:
    one = load_artifact().pipeline("mimo_audio").fit
    assert one is not None and len(one.runs) == 1
    (keys,) = items_by_run(one).values()
    assert all(record == item for record, item in keys.items())  # point/system, as recorded
    several = one.model_copy(
        update={
            "runs": ["a/x-v1", "a/y-v2"],
            "fit_items": ["a/x-v1/r8/horizon", "a/y-v2/r6-l60/edf-mps"],
            "holdout_items": ["a/y-v2/r10/priority"],
        }
    )
    assert items_by_run(several) == {
        "a/x-v1": {"a/x-v1/r8/horizon": "r8/horizon"},
        "a/y-v2": {
            "a/y-v2/r6-l60/edf-mps": "r6-l60/edf-mps",
            "a/y-v2/r10/priority": "r10/priority",
        },
    }
