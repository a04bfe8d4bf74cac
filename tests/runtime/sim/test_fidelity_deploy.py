"""One deploy description drives both engines: the reference presets and the simulator read the
same per-stage limits from the vLLM-Omni deploy YAML (plus the named "tuned" profile)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
import yaml

from horizonserve.runtime.artifact import load_artifact
from horizonserve.runtime.calibrate.records import read_members
from horizonserve.runtime.engine.deploy import PROFILES, load_deploy
from horizonserve.runtime.engine.reference.presets import get_preset
from horizonserve.runtime.sim.setup import SimSetup

ROOT = Path(__file__).resolve().parents[3]
CAMPAIGN = ROOT / "bench/results/h200-eval/qwen2_5_omni-2"


def _yaml_stages(pipeline: str) -> dict[int, dict]:
    ref = resources.files("horizonserve.runtime.engine.vllm_omni").joinpath(
        f"deploy/{pipeline}.yaml"
    )
    return {s["stage_id"]: s for s in yaml.safe_load(ref.read_text())["stages"]}


def test_tiny_preset_limits_come_from_the_deploy_yaml() -> None:
    speech, image = _yaml_stages("qwen2_5_omni"), _yaml_stages("bagel")
    p = get_preset("tiny", "stock")
    assert p.thinker_limits.max_batch == speech[0]["max_num_seqs"]
    assert p.thinker_limits.max_prefill_tokens == speech[0]["max_num_batched_tokens"]
    assert p.talker_limits.max_batch == speech[1]["max_num_seqs"]
    assert p.code2wav_max_batch == speech[2]["max_num_seqs"]
    assert p.dit_max_batch == image[1]["max_num_seqs"]
    assert p.deploy is not None
    assert p.deploy.stage("thinker").enforce_eager is speech[0]["enforce_eager"]
    # The shipped Qwen2.5-Omni file does not stream (async_chunk false): one chunk per answer.
    assert p.first_chunk == p.code_chunk == p.talker_limits.max_len
    tuned = get_preset("tiny", "tuned")
    assert tuned.deploy is not None and tuned.deploy.stage("talker").cuda_graphs
    assert tuned.thinker_limits.max_len == p.thinker_limits.max_len == 256  # the preset's own


def test_tuned_profile_is_what_the_h200_campaign_ran() -> None:
    """The campaign's engine (git 8eba334: thinker 48 slots / 8192 tokens, talker 16, 25-code
    chunks) equals the tuned profile, and its step traces reach exactly 48 sequences."""
    p = get_preset("full", "tuned")
    assert (p.thinker_limits.max_batch, p.thinker_limits.max_prefill_tokens) == (48, 8192)
    assert (p.talker_limits.max_batch, p.code_chunk, p.first_chunk) == (16, 25, 25)
    most, multi_prompt_tokens = 0, 0
    for session in sorted(CAMPAIGN.glob("s*/")):
        for member in read_members(session / "steps.jsonl.gz"):
            ix = {c: i for i, c in enumerate(member["columns"])}
            for r in member["rows"]:
                most = max(most, r[ix["decode_batch"]] + r[ix["prefill_batch"]])
                if r[ix["prefill_batch"]] > 1:
                    multi_prompt_tokens = max(multi_prompt_tokens, r[ix["prefill_tokens"]])
    assert most == p.thinker_limits.max_batch
    assert 0 < multi_prompt_tokens <= p.thinker_limits.max_prefill_tokens


def test_bagel_thinker_is_sized_by_bagels_own_deploy_file() -> None:
    """Serving BAGEL, the thinker takes BAGEL's deploy limits (stock: the shipped file's 12
    sequences / 32768 tokens), not Qwen2.5-Omni's; the tuned profile keeps the limits the H200
    BAGEL campaign ran (48 / 8192), whose step traces go past 12 sequences and never past 48."""
    image = _yaml_stages("bagel")
    stock = get_preset("full", "stock", "bagel").thinker_limits
    assert (stock.max_batch, stock.max_prefill_tokens) == (
        image[0]["max_num_seqs"],
        image[0]["max_num_batched_tokens"],
    )
    speech = get_preset("full", "stock", "qwen2_5_omni").thinker_limits
    assert speech.max_batch == _yaml_stages("qwen2_5_omni")[0]["max_num_seqs"] != stock.max_batch
    tuned = get_preset("full", "tuned", "bagel").thinker_limits
    assert (tuned.max_batch, tuned.max_prefill_tokens) == (48, 8192)
    most = 0
    for member in read_members(ROOT / "bench/results/h200-eval/eval-v5/b14/steps.jsonl.gz"):
        ix = {c: i for i, c in enumerate(member["columns"])}
        for r in member["rows"]:
            most = max(most, r[ix["decode_batch"]] + r[ix["prefill_batch"]])
    assert image[0]["max_num_seqs"] < most <= tuned.max_batch


@pytest.mark.parametrize("profile", PROFILES)
def test_simulator_reads_the_same_limits(profile: str) -> None:
    deploy = load_deploy("qwen2_5_omni", profile)
    setup = SimSetup.load("qwen2_5_omni", load_artifact(), deploy_profile=profile)
    sh = setup.cal.shared
    thinker = deploy.stage("thinker")
    assert (sh.max_num_seqs, sh.max_num_batched_tokens) == (
        thinker.max_num_seqs,
        thinker.max_num_batched_tokens,
    )
    talker, code2wav = setup.cal.downstream
    assert talker.max_batch == deploy.stage("talker").max_num_seqs
    assert code2wav.max_batch == deploy.stage("code2wav").max_num_seqs
    preset = get_preset("full", profile)
    if deploy.chunking is None:  # whole answers: first output after all the work
        assert talker.first_output_work is None and code2wav.first_output_work is None
    else:  # the engine's first chunk in codes, and its duration for code2wav
        assert talker.first_output_work == preset.first_chunk == 25
        assert code2wav.first_output_work == pytest.approx(25 / talker.work_per_audio_second)


def test_unknown_profile_and_pipeline_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown profile 'fast'"):
        load_deploy("qwen2_5_omni", "fast")
    with pytest.raises(ValueError, match="unknown pipeline"):
        load_deploy("llama", "stock")
