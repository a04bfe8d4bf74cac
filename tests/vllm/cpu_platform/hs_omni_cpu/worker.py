"""vLLM-Omni's AR and generation workers on vLLM's CPU worker and CPU model runner.

Each runner class puts vLLM's `CPUModelRunner` under vLLM-Omni's runner in the MRO, so
vLLM-Omni's per-stage logic (thinker hidden states, talker inputs, code2wav generation) runs
on top of the CPU runner's buffers, loading and device no-ops. Construction happens inside
vLLM's CUDA placeholder context, as `CPUModelRunner` itself does, because vLLM-Omni's runners
build CUDA events and streams in their constructors.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.worker import cpu_model_runner
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner
from vllm_omni.worker.mixins import OmniWorkerMixin


class CPUARModelRunner(GPUARModelRunner, CPUModelRunner):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cpu_model_runner._set_torch_accelerator_to_noop()
        with cpu_model_runner._torch_cuda_wrapper():
            super().__init__(*args, **kwargs)


class CPUGenerationModelRunner(GPUGenerationModelRunner, CPUModelRunner):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cpu_model_runner._set_torch_accelerator_to_noop()
        with cpu_model_runner._torch_cuda_wrapper():
            super().__init__(*args, **kwargs)


class _CPUOmniWorker(OmniWorkerMixin, CPUWorker):
    model_runner_cls: type[CPUModelRunner]

    def init_device(self) -> None:
        super().init_device()  # the CPU worker's device, threads, distributed env, seed
        # vLLM-Omni's hooks live in its runners (the v2 CPU runner has none of them).
        self.use_v2_model_runner = False
        self.model_runner = self.model_runner_cls(self.vllm_config, torch.device("cpu"))


class CPUARWorker(_CPUOmniWorker):
    """Thinker / talker stages."""

    model_runner_cls = CPUARModelRunner


class CPUGenerationWorker(_CPUOmniWorker):
    """code2wav (non-autoregressive generation) stage."""

    model_runner_cls = CPUGenerationModelRunner
