"""The calibration's in-situ measurements on a real GPU (tiny preset, quick): the three sharing
modes each measured, the engine's limits recorded, the artifact built from them."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def _quick_tiny_raw(tmp_path: Path, pipelines: tuple[str, ...]) -> dict:
    """The raw measurements of a quick tiny-preset calibration of `pipelines` on cuda:0."""
    from horizonserve.runtime.calibrate.measure import CalibrationOptions, Calibrator

    opts = CalibrationOptions(
        pipelines=pipelines,
        preset="tiny",
        quick=True,
        device="cuda:0",
        solo_requests=4,
        levels=(32, 64),
        checkpoint=str(tmp_path / "ck.json"),
        resume=True,
    )
    return Calibrator(opts).run()


def test_quick_tiny_calibration_measures_every_sharing_mode(tmp_path: Path) -> None:
    from horizonserve.runtime.calibrate.build import build_artifact

    raw = _quick_tiny_raw(tmp_path, ("qwen2_5_omni",))
    done = set(raw["done"])
    assert {"iso", "corun.speech", "corun.code2wav", "baseline.speech", "mps.speech"} <= done
    assert "solo" in done and "baseline.code2wav" not in done  # whole-GPU factors: the talker
    assert raw["pipeline2"]["sharing"] == "timeslice"
    assert raw["pipeline3"]["sharing"] in ("mps", "timeslice")  # timeslice: MPS unavailable
    art, summary = build_artifact(raw, "pytest")
    p = art.pipeline("qwen2_5_omni")
    print(p.sharing, {k: v for k, v in p.notes.items() if k.startswith("sharing")})
    assert p.notes["sharing.timeslice_downstream_factor"].startswith("measured")
    assert p.notes["downstream.code2wav.corun_factor"].startswith("measured: code2wav chunk")
    if raw["pipeline3"]["sharing"] == "mps":
        assert "pipeline 3" in p.notes["sharing.mps_downstream_factor"]
    assert p.deploy_profile == raw["engine"]["deploy_profile"]
    assert all(n == 4 for n in p.solo_samples.values())
    assert summary["pipelines"]["qwen2_5_omni"]["solo_wall_s"]


def test_each_pipeline_decides_what_pays_from_what_this_gpu_measured(tmp_path: Path) -> None:
    """Throttling and the reservation per pipeline, next to its own co-runner (talker for
    Qwen2.5-Omni, DiT for BAGEL), decided from this GPU's measurements (tiny preset, quick):
    the curves each decision reads are measured here, not carried over, and the control knobs
    the artifact gives (`control()`, what serving configs take) follow from those curves.
    Prints each decision with its inputs."""
    from horizonserve.runtime.calibrate.build import build_artifact

    pipelines = ("qwen2_5_omni", "bagel")
    art, _summary = build_artifact(_quick_tiny_raw(tmp_path, pipelines), "pytest")
    for name in pipelines:
        p = art.pipeline(name)
        for key in ("shared.decode_step_s", "shared.corun_decode_factor"):
            assert p.notes[key].startswith("measured"), (name, key, p.notes[key])
        s, ladder = p.shared, p.ladder
        capped = s.decode_step_s.at(ladder.s_cap) * s.corun_decode_factor.at(ladder.s_cap)
        full = s.corun_decode_factor.at(ladder.total)
        lifted = s.decode_step_s.at(ladder.aggressive) * p.sharing.mps_shared_factor(full)
        control = p.verdicts()
        assert control.throttling_pays == (lifted >= capped), (name, capped, lifted)
        assert control.backlog_lift_pays == (lifted < capped)
        print(
            f"{name} beside {p.downstream[0].name}: decode capped at S_cap {ladder.s_cap} "
            f"{capped * 1e3:.3f} ms, uncapped under MPS {lifted * 1e3:.3f} ms -> "
            f"throttling_pays {control.throttling_pays}; reservation_pays "
            f"{control.reservation_pays} (reserve {p.reserve_choice()} SMs)"
        )
