"""Environment of the vLLM-Omni plugin: whether it is on, its ServingConfig, its knobs.

Every stage process (API server, each stage's engine core, each worker, the diffusion
process) reads the same environment, so they agree without talking. The process that
registers the plugin first (the API server: it loads plugins while building its argument
parser, before any stage is spawned) resolves the ServingConfig once and exports the result
in `RESOLVED_CONFIG_ENV`, so children never resolve it differently (e.g. while a calibration
artifact is being replaced).

Precedence of the ServingConfig:
  1. `HORIZONSERVE_SERVING_CONFIG` (JSON; what the operator passes), else
  2. `HORIZONSERVE_CONFIG_FILE` (path to the same JSON), else
  3. the shipped pipeline definition (`HORIZONSERVE_PIPELINE`, or the model's HF model_type)
     with the default SM ladder;
`HORIZONSERVE_POLICY` (one of `runtime.config.PolicyName`: horizon, fcfs, edf, priority and
the ablations), when set, replaces the config's policy — the one switch between HorizonServe
and the baselines, e.g. `priority`: vLLM's own priority scheduler on the API priority code;
then the node's calibration artifact, when one is found, replaces the measured parts:
per-class solo p95 (so the SLO targets), B_sat, and the ladder unless the config pins one
(a ladder different from `default_ladder(total)`). The artifact is `HORIZONSERVE_CALIBRATION_
ARTIFACT` (a file), else the newest match for model + GPU + driver in `HORIZONSERVE_ARTIFACT_DIR`
(skipped when `HORIZONSERVE_CALIBRATION_MODE=skip`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from horizonserve.runtime.baselines import check_engine
from horizonserve.runtime.config import (
    ARTIFACT_DIR_ENV,
    CALIBRATION_MODE_ENV,
    PIPELINES,
    SERVING_CONFIG_ENV,
    CalibrationMode,
    ControlParams,
    PolicyName,
    RequestClass,
    ServingConfig,
    SloTable,
    default_ladder,
    load_pipeline,
)

if TYPE_CHECKING:
    from horizonserve.runtime.artifact import PipelineCalibration

log = logging.getLogger(__name__)

# -- switches ----------------------------------------------------------------------------------
ENABLE_ENV = "HORIZONSERVE_VLLM"  # "1" on, "0" off (wins over a present config)
CONFIG_FILE_ENV = "HORIZONSERVE_CONFIG_FILE"  # ServingConfig JSON file
PIPELINE_ENV = "HORIZONSERVE_PIPELINE"  # qwen2_5_omni | mimo_audio | bagel (no config given)
POLICY_ENV = "HORIZONSERVE_POLICY"  # overrides ServingConfig.policy (baselines, ablations)
ARTIFACT_ENV = "HORIZONSERVE_CALIBRATION_ARTIFACT"  # one calibration artifact file
RESOLVED_CONFIG_ENV = "HORIZONSERVE_VLLM_RESOLVED_CONFIG"  # internal: root → children
RUN_ENV = "HORIZONSERVE_VLLM_RUN"  # internal: names this server's shared-memory files
# -- knobs -------------------------------------------------------------------------------------
MAX_AGE_ENV = "HORIZONSERVE_VLLM_MAX_AGE_S"  # downstream heartbeat older than this = idle
MARGIN_ENV = "HORIZONSERVE_VLLM_WINDOW_MARGIN"  # extra visible requests shown; "all" = no window
CAPTURE_ENV = "HORIZONSERVE_VLLM_CAPTURE_LEVEL"  # cap | aggressive | full
SM_CONTROL_ENV = "HORIZONSERVE_VLLM_SM_CONTROL"  # "0": no Green Contexts in the workers
MPS_ENV = "HORIZONSERVE_VLLM_MPS"  # "1": start an MPS daemon for the stage processes
STATS_INTERVAL_ENV = "HORIZONSERVE_VLLM_STATS_INTERVAL_S"
PIPELINES_ENV = "HORIZONSERVE_VLLM_PIPELINES"  # registry keys to re-register (comma list)
DEPLOY_DIR_ENV = "HORIZONSERVE_VLLM_DEPLOY_DIR"  # single-GPU deploy yamls; "none": keep Omni's

# Registry keys of vLLM-Omni 0.30 pipelines served by the plugin, and the shipped HorizonServe
# pipeline definition (classes, SLO profile) each one uses.
TARGET_PIPELINES: dict[str, str] = {
    "qwen2_5_omni": "qwen2_5_omni",
    "mimo_audio": "mimo_audio",
    "bagel": "bagel",
    "bagel_think": "bagel",
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class PluginConfigError(ValueError):
    """The plugin is on but its configuration cannot be built; the message says why."""


def _flag(env: Mapping[str, str], name: str) -> bool | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise PluginConfigError(f"{name}={raw!r}: use 1 or 0")


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """On when HORIZONSERVE_VLLM=1, or when a ServingConfig is given and HORIZONSERVE_VLLM≠0."""
    env = os.environ if env is None else env
    flag = _flag(env, ENABLE_ENV)
    if flag is not None:
        return flag
    return bool(env.get(SERVING_CONFIG_ENV) or env.get(CONFIG_FILE_ENV))


@dataclass(frozen=True, slots=True)
class Knobs:
    """Plugin settings besides the ServingConfig (all from the environment)."""

    max_age_s: float = 2.0
    window_margin: int | None = 8  # None: hide from the whole queue (no window)
    capture_level: str = "cap"
    sm_control: bool = True
    mps: bool = False
    stats_interval_s: float = 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Knobs:
        env = os.environ if env is None else env
        margin_raw = env.get(MARGIN_ENV, "8").strip().lower()
        try:
            margin = None if margin_raw == "all" else int(margin_raw)
            max_age = float(env.get(MAX_AGE_ENV, "2.0"))
            stats = float(env.get(STATS_INTERVAL_ENV, "5.0"))
        except ValueError as exc:
            raise PluginConfigError(f"bad plugin setting: {exc}") from None
        if margin is not None and margin < 0:
            raise PluginConfigError(f"{MARGIN_ENV} must be >= 0 or 'all', got {margin_raw!r}")
        capture = env.get(CAPTURE_ENV, "cap").strip().lower()
        if capture not in ("cap", "aggressive", "full"):
            raise PluginConfigError(f"{CAPTURE_ENV} must be cap, aggressive or full")
        return cls(
            max_age_s=max_age,
            window_margin=margin,
            capture_level=capture,
            sm_control=_flag(env, SM_CONTROL_ENV) is not False,
            mps=_flag(env, MPS_ENV) is True,
            stats_interval_s=stats,
        )


def target_pipelines(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    env = os.environ if env is None else env
    raw = env.get(PIPELINES_ENV)
    if not raw:
        return tuple(TARGET_PIPELINES)
    return tuple(k.strip() for k in raw.split(",") if k.strip())


def deploy_file(key: str, env: Mapping[str, str] | None = None) -> Path | None:
    """HorizonServe's single-GPU deploy yaml for pipeline `key`, if there is one.

    From `HORIZONSERVE_VLLM_DEPLOY_DIR` (the serving image sets it), else the `deploy/` folder
    beside this module (a source checkout / editable install).
    """
    env = os.environ if env is None else env
    raw = env.get(DEPLOY_DIR_ENV)
    if raw is not None and raw.strip().lower() in ("", "none", "0"):
        return None
    folder = Path(raw) if raw else Path(__file__).resolve().parent / "deploy"
    path = folder / f"{key}.yaml"
    return path if path.is_file() else None


# -- ServingConfig -------------------------------------------------------------------------------


def _pipeline_name(hint: str | None, env: Mapping[str, str]) -> str:
    name = env.get(PIPELINE_ENV) or (TARGET_PIPELINES.get(hint or "") if hint else None)
    if name is None:
        raise PluginConfigError(
            f"HorizonServe is on but has no ServingConfig: set {SERVING_CONFIG_ENV} (JSON), "
            f"{CONFIG_FILE_ENV} (file) or {PIPELINE_ENV} (one of {list(PIPELINES)})"
            + (f"; model_type {hint!r} is not a known pipeline" if hint else "")
        )
    if name not in PIPELINES:
        raise PluginConfigError(f"{PIPELINE_ENV}={name!r}: choose one of {list(PIPELINES)}")
    return name


def base_config(hint: str | None = None, env: Mapping[str, str] | None = None) -> ServingConfig:
    """The ServingConfig from the environment, before calibration is applied."""
    env = os.environ if env is None else env
    try:
        if env.get(SERVING_CONFIG_ENV):
            return ServingConfig.model_validate_json(env[SERVING_CONFIG_ENV])
        if env.get(CONFIG_FILE_ENV):
            path = Path(env[CONFIG_FILE_ENV])
            return ServingConfig.model_validate_json(path.read_text())
    except (OSError, ValueError) as exc:
        raise PluginConfigError(f"cannot read the ServingConfig: {exc}") from None
    spec = load_pipeline(_pipeline_name(hint, env))
    return ServingConfig(
        model=spec.model,
        pipeline=spec.name,
        slo=spec.slo,
        ladder=default_ladder(),
        control=ControlParams(),
    )


def with_policy(config: ServingConfig, env: Mapping[str, str] | None = None) -> ServingConfig:
    """`config` under the policy `HORIZONSERVE_POLICY` names, when it is set."""
    env = os.environ if env is None else env
    raw = (env.get(POLICY_ENV) or "").strip()
    if not raw:
        return config
    try:
        policy = PolicyName(raw.lower())
    except ValueError:
        choices = ", ".join(p.value for p in PolicyName)
        raise PluginConfigError(f"{POLICY_ENV}={raw!r}: choose one of {choices}") from None
    return config.model_copy(update={"policy": policy})


def apply_calibration(config: ServingConfig, artifact: object) -> ServingConfig:
    """Measured solo p95 (→ SLO targets), per-token decode times (→ class profiles), B_sat
    and (unless pinned) the ladder of an artifact."""
    from horizonserve.runtime.artifact import CalibrationArtifact

    assert isinstance(artifact, CalibrationArtifact)
    entry = artifact.pipelines.get(config.pipeline)
    if entry is None:
        log.warning(
            "calibration artifact has no pipeline %r (it has %s): not applied",
            config.pipeline,
            sorted(artifact.pipelines),
        )
        return config
    classes = [_calibrated_class(c, entry) for c in config.slo.classes]
    slo = SloTable.model_validate({**config.slo.model_dump(), "classes": classes})
    pinned = config.ladder != default_ladder(config.ladder.total)
    ladder = config.ladder if pinned else entry.ladder
    control = config.control
    if control.b_sat == ControlParams().b_sat:
        control = control.model_copy(update={"b_sat": entry.b_sat})
    return config.model_copy(update={"slo": slo, "ladder": ladder, "control": control})


def _calibrated_class(cls: RequestClass, entry: PipelineCalibration) -> RequestClass:
    """`cls` with what `entry` measured for it (the rest as configured)."""
    update: dict[str, object] = {}
    if cls.name in entry.solo_p95_s:
        update["solo_p95_s"] = entry.solo_p95_s[cls.name]
    if cls.name in entry.tpot_s:
        update["profile"] = cls.profile.model_copy(update={"tpot_s": entry.tpot_s[cls.name]})
    return cls.model_copy(update=update) if update else cls


def find_calibration(config: ServingConfig, env: Mapping[str, str]) -> Path | None:
    explicit = env.get(ARTIFACT_ENV)
    if explicit:
        return Path(explicit)
    directory = env.get(ARTIFACT_DIR_ENV)
    mode = env.get(CALIBRATION_MODE_ENV, CalibrationMode.AUTO.value)
    if not directory or mode == CalibrationMode.SKIP.value:
        return None
    from horizonserve.runtime.artifact_store import detect_gpu, find_artifact

    gpu = detect_gpu()
    if gpu is None:
        return None
    root = Path(directory)
    for folder in (root, root / "calibration"):
        if folder.is_dir():
            found = find_artifact(folder, config.pipeline, config.model, gpu)
            if found is not None:
                return found
    return None


REJECT_LATE_UNSUPPORTED = (
    "control.reject_late: the vLLM-Omni plugin cannot refuse a request at a downstream stage "
    "(vLLM-Omni has no path there that answers the client with a reason); set reject_late "
    "false: late requests are then served behind the meetable ones and counted"
)


def check_supported(config: ServingConfig) -> ServingConfig:
    """`config`, or PluginConfigError naming the control the plugin cannot apply and the fix."""
    if config.resolved().reject_late:
        raise PluginConfigError(REJECT_LATE_UNSUPPORTED)
    try:  # a 2026 baseline whose rules the plugin lacks never runs as its plain preset
        check_engine(config.policy, "vllm-omni")
    except ValueError as exc:
        raise PluginConfigError(f"{POLICY_ENV} / policy: {exc}") from None
    return config


def resolve_config(hint: str | None = None, env: Mapping[str, str] | None = None) -> ServingConfig:
    """The ServingConfig this process serves with (see the module docstring)."""
    env = os.environ if env is None else env
    resolved = env.get(RESOLVED_CONFIG_ENV)
    if resolved:
        return check_supported(ServingConfig.model_validate_json(resolved))
    config = check_supported(with_policy(base_config(hint, env), env))
    path = find_calibration(config, env)
    if path is not None:
        from horizonserve.runtime.artifact import load_artifact

        try:
            config = apply_calibration(config, load_artifact(path))
            log.info("HorizonServe: calibration artifact %s applied", path)
        except (OSError, ValueError) as exc:
            raise PluginConfigError(f"calibration artifact {path}: {exc}") from None
    return config
