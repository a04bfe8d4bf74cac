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

from hs_omni_cpu import trace

DEFAULT_VOICE = "Chelsie"  # the default of Qwen2_5OmniForConditionalGeneration.forward


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
        trace.trace_init(self.vllm_config)

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        trace.trace_step(self.vllm_config, scheduler_output)
        return super().execute_model(scheduler_output, *args, **kwargs)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        # Qwen2.5-Omni's model sets its default voice on its first forward ("temporal hack",
        # vllm_omni/model_executor/models/qwen2_5_omni/qwen2_5_omni.py); on GPU that is the
        # warm-up forward, which vLLM's CPU worker skips for an eager model with a fixed KV
        # size. Without it the talker's first real step fails on `voice_type`.
        model = self.model_runner.get_model()
        if hasattr(model, "talker") and not hasattr(model, "voice_type"):
            model.voice_type = DEFAULT_VOICE


class CPUARWorker(_CPUOmniWorker):
    """Thinker / talker stages."""

    model_runner_cls = CPUARModelRunner


class CPUGenerationWorker(_CPUOmniWorker):
    """code2wav (non-autoregressive generation) stage."""

    model_runner_cls = CPUGenerationModelRunner
