"""A calibration entry with the engine limits of a deploy description (`engine.deploy`).

The artifact measures costs; slot limits, token budgets and first-chunk sizes are settings of
the engine that ran, so the simulator and the calibration take them from the same deploy file
the engine reads instead of carrying numbers of their own.
"""

from __future__ import annotations

from horizonserve.runtime.artifact import (
    DownstreamStageCalibration,
    PipelineCalibration,
)
from horizonserve.runtime.engine.deploy import DeployLimits, graph_batch_sizes

# Deploy-file role of an artifact's downstream stage, where the names differ.
ROLE_OF = {"diffusion": "dit"}


def with_deploy(cal: PipelineCalibration, deploy: DeployLimits) -> PipelineCalibration:
    """`cal` with the engine limits of `deploy`: the shared stage's sequences, token budget and
    CUDA-graph batch sizes (thinker), each downstream stage's slots, and the first-chunk size.
    Stages the deploy file does not name keep the artifact's values.

    The talker's work is codec codes (`work_per_audio_second` codes per spoken second), so its
    first output is the first chunk's codes; code2wav's work is seconds of audio, so its first
    output is that chunk's duration. Without chunking both hand on only the whole answer.
    """
    sh = cal.shared
    if deploy.has("thinker"):
        t = deploy.stage("thinker")
        upd: dict[str, object] = {
            "max_num_seqs": t.max_num_seqs,
            "max_num_batched_tokens": t.max_num_batched_tokens,
            "graph_batch_sizes": list(graph_batch_sizes(t.max_num_seqs)) if t.cuda_graphs else None,
        }
        sh = sh.model_copy(update=upd)
    chunk = deploy.chunking
    codes_per_s = next((d.work_per_audio_second for d in cal.downstream if d.name == "talker"), 0)
    down: list[DownstreamStageCalibration] = []
    for d in cal.downstream:
        role = ROLE_OF.get(d.name, d.name)
        if not deploy.has(role):
            down.append(d)
            continue
        upd2: dict[str, object] = {"max_batch": deploy.stage(role).max_num_seqs}
        if d.name == "talker":
            upd2["first_output_work"] = float(chunk.first) if chunk else None
        elif d.name == "code2wav" and codes_per_s > 0:
            first = chunk.first / codes_per_s * d.work_per_audio_second if chunk else None
            upd2["first_output_work"] = first
        down.append(d.model_copy(update=upd2))
    return cal.model_copy(update={"shared": sh, "downstream": down})
