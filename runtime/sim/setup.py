"""What one simulated deployment is: pipeline classes, calibration, SLO table, control knobs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from horizonserve.runtime.calibrate.artifact import (
    CalibrationArtifact,
    DownstreamStageCalibration,
    PipelineCalibration,
    load_artifact,
)
from horizonserve.runtime.config import (
    ControlParams,
    Path,
    PipelineSpec,
    PolicyName,
    ServingConfig,
    SloTable,
    load_pipeline,
)
from horizonserve.runtime.engine.deploy import DeployLimits, load_deploy
from horizonserve.runtime.sim.profiles import derive_profile
from horizonserve.runtime.workload import load_workload


def with_deploy(cal: PipelineCalibration, deploy: DeployLimits) -> PipelineCalibration:
    """`cal` with the engine limits of `deploy`: the shared stage's sequences and token budget
    (thinker), each downstream stage's slots, and the first-chunk size. Stages the deploy file
    does not name keep the artifact's values.

    The talker's work is codec codes (`work_per_audio_second` codes per spoken second), so its
    first output is the first chunk's codes; code2wav's work is seconds of audio, so its first
    output is that chunk's duration. Without chunking both hand on only the whole answer.
    """
    sh = cal.shared
    if deploy.has("thinker"):
        t = deploy.stage("thinker")
        upd = {"max_num_seqs": t.max_num_seqs, "max_num_batched_tokens": t.max_num_batched_tokens}
        sh = sh.model_copy(update=upd)
    chunk = deploy.chunking
    codes_per_s = next((d.work_per_audio_second for d in cal.downstream if d.name == "talker"), 0)
    down: list[DownstreamStageCalibration] = []
    for d in cal.downstream:
        if not deploy.has(d.name):
            down.append(d)
            continue
        upd2: dict[str, object] = {"max_batch": deploy.stage(d.name).max_num_seqs}
        if d.name == "talker":
            upd2["first_output_work"] = float(chunk.first) if chunk else None
        elif d.name == "code2wav" and codes_per_s > 0:
            first = chunk.first / codes_per_s * d.work_per_audio_second if chunk else None
            upd2["first_output_work"] = first
        down.append(d.model_copy(update=upd2))
    return cal.model_copy(update={"shared": sh, "downstream": down})


@dataclass(frozen=True)
class SimSetup:
    spec: PipelineSpec
    cal: PipelineCalibration
    slo: SloTable  # the SLO table the policies and the metrics use
    control: ControlParams = field(default_factory=ControlParams)
    slo_source: str = "pipeline defaults"

    @classmethod
    def load(
        cls,
        pipeline: str,
        artifact: CalibrationArtifact | None = None,
        control: ControlParams | None = None,
        *,
        derive_profiles: bool = True,
        deploy_profile: str | None = None,
    ) -> SimSetup:
        """The pipeline file's classes on `artifact` (default: the package's default artifact).

        With `derive_profiles` the classes' r̂ profiles are derived from the artifact being
        simulated (`sim.profiles.derive_profile`), as a calibration on that GPU would record
        them; for the default artifact they equal the shipped ones (a test checks it). Without,
        the pipeline file's profiles are used whatever the artifact.

        Engine limits come from the deploy description (`engine.deploy`) under
        `deploy_profile`, else under the artifact's own `deploy_profile`; with neither, the
        artifact's limits stand.
        """
        spec = load_pipeline(pipeline)
        art = artifact if artifact is not None else load_artifact()
        cal = art.pipeline(pipeline)
        profile = deploy_profile or cal.deploy_profile
        if profile is not None:
            cal = with_deploy(cal, load_deploy(pipeline, profile))
        ctl = control if control is not None else cal.control()
        slo = spec.slo
        if derive_profiles:
            wl = load_workload(pipeline)
            classes = [
                c.model_copy(update={"profile": derive_profile(cal, wl, wl.get(c.name), c)})
                for c in slo.classes
            ]
            slo = SloTable.model_validate({**slo.model_dump(), "classes": classes})
        return cls(spec=spec, cal=cal, slo=slo, control=ctl)

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.slo.classes)

    @property
    def long_classes(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.slo.classes if c.path is Path.LONG)

    def targets(self) -> dict[str, float]:
        return {c.name: self.slo.target_s(c.name) for c in self.slo.classes}

    def serving_config(self, policy: PolicyName) -> ServingConfig:
        return ServingConfig(
            model=self.spec.model,
            pipeline=self.spec.name,
            policy=policy,
            slo=self.slo,
            ladder=self.cal.ladder,
            control=self.control,
        )

    def with_solo_p95(
        self, p95: dict[str, float], source: str, multiplier: float | None = None
    ) -> SimSetup:
        """The same setup with SLO targets from measured solo p95 latencies."""
        classes = [
            c.model_copy(update={"solo_p95_s": p95.get(c.name, c.solo_p95_s)})
            for c in self.slo.classes
        ]
        update: dict[str, object] = {"classes": classes}
        if multiplier is not None:
            update["multiplier"] = multiplier
        slo = SloTable.model_validate({**self.slo.model_dump(), **update})
        return replace(self, slo=slo, slo_source=source)
