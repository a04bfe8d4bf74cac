"""The vLLM-Omni plugin refuses a 2026 baseline whose rules it does not apply.

`shed`, `vllm-omni-current` and `mps-static` add rules (queue limits, the talker window and
tiers, a fixed SM share) that only the simulator (and, for shedding, the reference engine)
apply. Run in the plugin they would be their plain preset under another name.
"""

from __future__ import annotations

import pytest

from horizonserve.runtime.config import PolicyName
from horizonserve.runtime.engine.vllm_omni.settings import (
    POLICY_ENV,
    PluginConfigError,
    resolve_config,
)

BASELINES_2026 = ["shed", "shed-edf", "vllm-omni-current", "mps-static"]


@pytest.mark.parametrize("name", BASELINES_2026)
def test_baseline_without_its_rules_is_refused_naming_the_policy(name: str) -> None:
    env = {POLICY_ENV: name, "HORIZONSERVE_PIPELINE": "qwen2_5_omni"}
    with pytest.raises(PluginConfigError, match=rf"policy {name!r}: the vllm-omni engine"):
        resolve_config(env=env)


@pytest.mark.parametrize("name", ["horizon", "fcfs", "edf", "priority"])
def test_presets_the_plugin_applies_still_start(name: str) -> None:
    env = {POLICY_ENV: name, "HORIZONSERVE_PIPELINE": "qwen2_5_omni"}
    assert resolve_config(env=env).policy is PolicyName(name)
