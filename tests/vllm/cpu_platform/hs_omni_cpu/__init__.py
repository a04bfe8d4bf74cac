"""Test-only CPU platform for vLLM-Omni: its AR and generation workers run vLLM's CPU model
runner under vLLM-Omni's runners. Registered through `vllm_omni.platform_plugins`; active only
when HS_OMNI_CPU_PLATFORM=1 so that installing it changes nothing else."""

from __future__ import annotations

import os

ENABLE_ENV = "HS_OMNI_CPU_PLATFORM"


def omni_platform_plugin() -> str | None:
    """vLLM-Omni's detector protocol: the platform class's qualified name, or None."""
    if os.environ.get(ENABLE_ENV, "1") != "1":
        return None
    return "hs_omni_cpu.platform.CPUOmniPlatform"
