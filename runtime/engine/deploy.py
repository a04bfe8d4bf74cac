"""The deploy description both engines read: per-stage serving limits from the vLLM-Omni YAML.

    limits = load_deploy("qwen2_5_omni")            # the shipped deploy file ("stock")
    limits = load_deploy("qwen2_5_omni", "tuned")   # + runtime/data/deploy/tuned.yaml
    limits.stage("talker").max_num_seqs

"stock" is `runtime/engine/vllm_omni/deploy/<pipeline>.yaml` as the vLLM-Omni plugin ships it.
A named profile merges `runtime/data/deploy/<profile>.yaml` over it by `stage_id`, the way
vLLM-Omni merges its `platforms:` overrides. The reference engine sizes its stages from the
result and the simulator reads the same values (`sim.setup.SimSetup.load`), so one file decides
both. Fields a stage leaves out take vLLM's defaults (`VLLM_DEFAULTS`).

Code2wav chunking: `code2wav_chunk: {first, every}` (codec codes) when the profile sets it, else
the connector's `codec_chunk_frames` when `async_chunk` is on, else none: the stage receives each
answer whole (vLLM-Omni's non-streaming path), so its first audio follows the last code.

Pure data, no torch: this module sits below both engines and the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

PROFILES = ("stock", "tuned")
DEFAULT_PROFILE = "stock"

# Stage roles by stage_id, per pipeline (the order of vLLM-Omni's stage graph).
ROLES: dict[str, tuple[str, ...]] = {
    "qwen2_5_omni": ("thinker", "talker", "code2wav"),
    "mimo_audio": ("thinker", "code2wav"),
    "bagel": ("thinker", "dit"),
}
# vLLM's values for fields a stage omits (vLLM 0.30 EngineArgs / vLLM-Omni StageDeployConfig).
VLLM_DEFAULTS: dict[str, Any] = {
    "max_num_seqs": 256,
    "max_num_batched_tokens": 32768,
    "enforce_eager": False,
    "gpu_memory_utilization": 0.9,
    "max_model_len": None,
}


@dataclass(frozen=True, slots=True)
class StageDeploy:
    """Serving limits of one stage process."""

    stage_id: int
    role: str  # thinker | talker | code2wav | dit
    max_num_seqs: int  # sequences (KV slots) in flight
    max_num_batched_tokens: int  # token budget per iteration
    enforce_eager: bool  # True: no CUDA graphs
    gpu_memory_utilization: float  # share of GPU memory this stage may take
    max_model_len: int | None  # tokens per sequence (None: the model's own)

    @property
    def cuda_graphs(self) -> bool:
        return not self.enforce_eager


@dataclass(frozen=True, slots=True)
class Code2WavChunking:
    """Codec codes per waveform chunk; `first` codes make the first audio (the TTFO event)."""

    first: int
    every: int


@dataclass(frozen=True, slots=True)
class DeployLimits:
    pipeline: str
    profile: str
    source: str  # which files, for provenance
    stages: tuple[StageDeploy, ...]
    chunking: Code2WavChunking | None  # None: code2wav gets each answer whole

    def stage(self, role: str) -> StageDeploy:
        for s in self.stages:
            if s.role == role:
                return s
        have = [s.role for s in self.stages]
        raise ValueError(f"deploy {self.pipeline}/{self.profile}: no {role!r} stage; has {have}")

    def has(self, role: str) -> bool:
        return any(s.role == role for s in self.stages)


def graph_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Decode batch sizes an AR stage captures as CUDA graphs: powers of two below
    max_num_seqs, then max_num_seqs (a step pads its rows up to the next one)."""
    out, n = [], 1
    while n < max_num_seqs:
        out.append(n)
        n *= 2
    out.append(max_num_seqs)
    return tuple(out)


def _read(package: str, rel: str) -> dict[str, Any]:
    text = resources.files(package).joinpath(rel).read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{package}/{rel}: expected a mapping at the top level")
    return data


def _merge(base: dict[str, Any], over: dict[str, Any], where: str) -> dict[str, Any]:
    out = {k: v for k, v in base.items() if k != "stages"}
    out.update({k: v for k, v in over.items() if k != "stages"})
    stages = {int(s["stage_id"]): dict(s) for s in base.get("stages", [])}
    for s in over.get("stages", []):
        sid = int(s["stage_id"])
        if sid not in stages:
            raise ValueError(f"{where}: stage_id {sid} is not in the deploy file")
        stages[sid].update(s)
    out["stages"] = [stages[k] for k in sorted(stages)]
    return out


def _chunking(doc: dict[str, Any]) -> Code2WavChunking | None:
    c = doc.get("code2wav_chunk")
    if c is not None:
        return Code2WavChunking(first=int(c["first"]), every=int(c["every"]))
    if not doc.get("async_chunk", False):
        return None
    for conn in (doc.get("connectors") or {}).values():
        frames = (conn.get("extra") or {}).get("codec_chunk_frames")
        if frames:
            return Code2WavChunking(first=int(frames), every=int(frames))
    return None


def load_deploy(pipeline: str, profile: str = DEFAULT_PROFILE) -> DeployLimits:
    """Per-stage limits of `pipeline` under `profile` (module docstring)."""
    if pipeline not in ROLES:
        raise ValueError(f"deploy: unknown pipeline {pipeline!r}; choose one of {list(ROLES)}")
    if profile not in PROFILES:
        raise ValueError(f"deploy: unknown profile {profile!r}; choose one of {list(PROFILES)}")
    base_rel = f"deploy/{pipeline}.yaml"
    doc = _read("horizonserve.runtime.engine.vllm_omni", base_rel)
    source = f"runtime/engine/vllm_omni/{base_rel}"
    if profile != "stock":
        rel = f"data/deploy/{profile}.yaml"
        over = _read("horizonserve.runtime", rel).get(pipeline) or {}
        doc = _merge(doc, over, f"runtime/{rel} [{pipeline}]")
        source += f" + runtime/{rel} [{pipeline}]"
    roles = ROLES[pipeline]
    stages = []
    for s in doc["stages"]:
        sid = int(s["stage_id"])
        if sid >= len(roles):
            raise ValueError(f"{source}: stage_id {sid} has no role in {pipeline} ({roles})")
        v = {k: s.get(k, d) for k, d in VLLM_DEFAULTS.items()}
        stages.append(
            StageDeploy(
                stage_id=sid,
                role=roles[sid],
                max_num_seqs=int(v["max_num_seqs"]),
                max_num_batched_tokens=int(v["max_num_batched_tokens"]),
                enforce_eager=bool(v["enforce_eager"]),
                gpu_memory_utilization=float(v["gpu_memory_utilization"]),
                max_model_len=None if v["max_model_len"] is None else int(v["max_model_len"]),
            )
        )
    return DeployLimits(pipeline, profile, source, tuple(stages), _chunking(doc))
