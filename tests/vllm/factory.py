"""Build REAL vLLM / vLLM-Omni schedulers and requests on CPU, with no download.

This is the ground the HorizonServe vLLM-Omni plugin tests stand on: the scheduler objects
are the production classes (`vllm.v1.core.sched.scheduler.Scheduler`,
`vllm_omni.core.sched.omni_ar_scheduler.OmniARScheduler`, and their async variants), configured
the way vLLM's own `tests/v1/core/utils.py::create_scheduler` does it:

* the model is a tiny Qwen2-style `config.json` written to a local directory (no weights, no
  tokenizer: `skip_tokenizer_init=True`), so `ModelConfig` resolves entirely offline;
* `DeviceConfig(device="cpu")` is passed explicitly, because the CUDA wheel of vLLM on a CPU-only
  machine resolves to the "unspecified" platform, which cannot infer a device type;
* the KV cache is a fake single-group `KVCacheConfig` with `num_blocks` blocks, i.e. the
  scheduler's block manager is real but no tensor is ever allocated.

Everything that touches vLLM is imported lazily inside the functions, so this module imports
without vLLM; callers skip with `pytest.importorskip` first (see conftest.py).

Notes on real behaviour that tests must respect:

* Importing `vllm_omni` (done here for every scheduler kind, since that is what a vLLM-Omni engine
  process does) rebinds `vllm.v1.request.Request` to `vllm_omni.request.OmniRequest` in every
  loaded module (vllm_omni/patch.py). `make_request` therefore builds whatever class
  `vllm.v1.request.Request` is at call time: an `OmniRequest`, which is a `Request` subclass.
* `ModelConfig` inspects the architecture once per machine in a subprocess
  (`python -m vllm.model_executor.models.registry`, cached under ~/.cache/vllm/modelinfos). That
  subprocess inherits the working directory, and from the repository root the project's own
  `operator/` folder would shadow the standard library `operator` module in it. The config is
  therefore built with the model directory as working directory.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

# A Qwen2-architecture config small enough to be meaningless but valid for transformers'
# Qwen2Config and vLLM's architecture registry. No weights or tokenizer files are needed.
# head_dim 64 (256 / 4): what vLLM's CPU attention backend needs when it really runs the model
# (vllm_cpu_engine.py, with dummy weights).
TINY_QWEN2_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "vocab_size": 1024,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": True,
}

EOS_TOKEN_ID = TINY_QWEN2_CONFIG["eos_token_id"]

VLLM_SKIP_REASON = (
    "vllm 0.30.0 / vllm-omni 0.30.0 are not installed in this venv; "
    "run `bash .ci/install-vllm.sh .venv`"
)

# Scheduler kinds accepted by `make_scheduler`.
SCHEDULER_KINDS = ("omni_ar", "omni_ar_async", "vllm", "vllm_async")


def require_vllm() -> None:
    """pytest-skip the caller unless the real vLLM and vLLM-Omni schedulers import.

    Deep modules are imported on purpose: the bare name `vllm` could also resolve to a stray
    namespace folder (such as tests/vllm itself when tests/ is on sys.path).
    """
    import pytest

    pytest.importorskip("vllm.v1.core.sched.scheduler", reason=VLLM_SKIP_REASON)
    pytest.importorskip("vllm_omni.core.sched.omni_ar_scheduler", reason=VLLM_SKIP_REASON)


def write_tiny_model_dir(path: str | os.PathLike[str]) -> Path:
    """Write the tiny Qwen2 `config.json` into `path` (created if needed) and return it."""
    model_dir = Path(path)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(TINY_QWEN2_CONFIG, indent=2) + "\n")
    return model_dir


def import_vllm_omni() -> None:
    """Import vllm_omni the way an engine process does (applies vllm_omni/patch.py)."""
    import vllm_omni  # noqa: F401


@dataclass(frozen=True)
class SchedulerParams:
    """Knobs of the VllmConfig built for a test scheduler (defaults: small and predictable)."""

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    max_model_len: int = 2048
    block_size: int = 16
    num_blocks: int = 1000
    policy: str = "fcfs"  # or "priority": orders waiting by (priority, arrival_time, id)
    enable_prefix_caching: bool = False
    long_prefill_token_threshold: int = 0
    # OmniModelConfig fields (only for the omni kinds)
    stage_id: int = 0
    model_stage: str = "thinker"


def make_vllm_config(
    model_dir: str | os.PathLike[str],
    params: SchedulerParams | None = None,
    *,
    async_scheduling: bool = False,
    omni: bool = True,
) -> VllmConfig:
    """Build a real `VllmConfig` for the tiny local model (no download, no GPU).

    With `omni=True` the model config is vLLM-Omni's `OmniModelConfig` (what every omni stage
    runs with: it carries `stage_id`, `model_stage`, `async_chunk`, `omni_kv_config`, ...);
    otherwise it is vLLM's plain `ModelConfig`.
    """
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig

    p = params or SchedulerParams()
    model_kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "skip_tokenizer_init": True,
        "dtype": "float32",
        "seed": 0,
        "max_model_len": p.max_model_len,
    }
    if omni:
        import_vllm_omni()
        from vllm_omni.config.model import OmniModelConfig

        model_cls: type[ModelConfig] = OmniModelConfig
        model_kwargs.update(stage_id=p.stage_id, model_stage=p.model_stage)
    else:
        model_cls = ModelConfig
    # See the module docstring: keep the registry-inspection subprocess out of the repo root.
    with contextlib.chdir(model_dir):
        model_config = model_cls(**model_kwargs)

    scheduler_config = SchedulerConfig(
        max_num_seqs=p.max_num_seqs,
        max_num_batched_tokens=p.max_num_batched_tokens,
        max_model_len=p.max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=p.long_prefill_token_threshold,
        policy=p.policy,
        async_scheduling=async_scheduling,
    )
    cache_config = CacheConfig(
        block_size=p.block_size,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=p.enable_prefix_caching,
    )
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
    )
    cache_config.num_gpu_blocks = p.num_blocks
    return vllm_config


def scheduler_class(kind: str) -> type:
    """The production scheduler class for `kind` (one of SCHEDULER_KINDS)."""
    if kind not in SCHEDULER_KINDS:
        raise ValueError(f"unknown scheduler kind {kind!r}; expected one of {SCHEDULER_KINDS}")
    # vLLM-Omni engine processes import vllm_omni before building any scheduler; do the same so
    # every kind sees the same (patched) Request class.
    import_vllm_omni()
    if kind.startswith("omni_ar"):
        from vllm_omni.core.sched.omni_ar_scheduler import OmniARAsyncScheduler, OmniARScheduler

        return OmniARAsyncScheduler if kind == "omni_ar_async" else OmniARScheduler
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    return AsyncScheduler if kind == "vllm_async" else Scheduler


def make_scheduler(
    kind: str,
    model_dir: str | os.PathLike[str],
    params: SchedulerParams | None = None,
    *,
    scheduler_cls: type | None = None,
) -> Any:
    """Construct a real scheduler of `kind` ("omni_ar", "omni_ar_async", "vllm", "vllm_async").

    `scheduler_cls` overrides the class (e.g. a HorizonServe subclass of OmniARScheduler); `kind`
    then only selects sync vs async configuration and plain vs omni model config.
    """
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    p = params or SchedulerParams()
    cls = scheduler_cls or scheduler_class(kind)
    is_async = kind.endswith("_async")
    vllm_config = make_vllm_config(
        model_dir, p, async_scheduling=is_async, omni=kind.startswith("omni")
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=p.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=p.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=p.block_size,
        log_stats=True,
    )


def _block_hasher(block_size: int) -> Any:
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    return get_request_block_hasher(block_size, hash_fn)


def make_request(
    request_id: str,
    prompt_len: int,
    *,
    max_tokens: int = 16,
    arrival_time: float | None = None,
    priority: int = 0,
    token_id: int | None = None,
    ignore_eos: bool = True,
    extra_args: dict[str, Any] | None = None,
    block_size: int | None = None,
) -> Request:
    """A real `vllm.v1.request.Request` (an OmniRequest once vllm_omni is imported).

    The prompt is `prompt_len` copies of `token_id` (default: derived from the id, so distinct
    requests never share a prefix). `extra_args` lands in `sampling_params.extra_args`, the
    channel a plugin can use to carry per-request class/deadline to every stage. Pass
    `block_size` when the scheduler has prefix caching enabled (attaches the block hasher).
    """
    from vllm.sampling_params import SamplingParams
    from vllm.v1 import request as request_module

    if prompt_len <= 0:
        raise ValueError("prompt_len must be positive")
    if token_id is None:
        token_id = 3 + (sum(request_id.encode()) % 900)
    sampling_params = SamplingParams(
        max_tokens=max_tokens, ignore_eos=ignore_eos, extra_args=extra_args
    )
    return request_module.Request(
        request_id=request_id,
        prompt_token_ids=[token_id] * prompt_len,
        sampling_params=sampling_params,
        pooling_params=None,
        arrival_time=arrival_time,
        priority=priority,
        block_hasher=_block_hasher(block_size) if block_size else None,
    )


def fake_model_output(
    scheduler: Any,
    scheduler_output: SchedulerOutput,
    *,
    token_id: int = 7,
    token_ids: dict[str, int] | None = None,
) -> ModelRunnerOutput:
    """The `ModelRunnerOutput` a model runner would return for `scheduler_output`.

    Every scheduled request that finished its prompt in this step (or is decoding) samples one
    token (`token_ids[req_id]` or `token_id`); a request still mid-prefill (chunked prefill)
    samples none. Call it right after the `schedule()` that produced `scheduler_output`: it reads
    `Request.is_prefill_chunk`, which that call set.
    """
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(scheduler_output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        if request.is_prefill_chunk:
            sampled.append([])
        else:
            sampled.append([(token_ids or {}).get(req_id, token_id)])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def run_step(scheduler: Any, *, token_id: int = 7) -> tuple[SchedulerOutput, dict[int, Any]]:
    """One synchronous engine step: schedule, fake the model run, feed the output back."""
    scheduler_output = scheduler.schedule()
    model_output = fake_model_output(scheduler, scheduler_output, token_id=token_id)
    engine_outputs = scheduler.update_from_output(scheduler_output, model_output)
    return scheduler_output, engine_outputs


def new_req_ids(scheduler_output: SchedulerOutput) -> list[str]:
    """Ids of requests scheduled for the first time (fresh prefills) in this step, in order."""
    return [data.req_id for data in scheduler_output.scheduled_new_reqs]


def cached_req_ids(scheduler_output: SchedulerOutput) -> list[str]:
    """Ids of already-running (or resumed) requests scheduled in this step, in order."""
    return list(scheduler_output.scheduled_cached_reqs.req_ids)


def queue_ids(queue: Iterable[Any]) -> list[str]:
    """Request ids of a RequestQueue / list, in the queue's iteration order."""
    return [request.request_id for request in queue]


def output_token_ids(engine_outputs: dict[int, Any]) -> dict[str, list[int]]:
    """{request_id: new_token_ids} from `update_from_output`'s per-client EngineCoreOutputs."""
    result: dict[str, list[int]] = {}
    for outputs in engine_outputs.values():
        for output in outputs.outputs:
            result.setdefault(output.request_id, []).extend(output.new_token_ids)
    return result


def add_requests(scheduler: Any, requests: Sequence[Request]) -> None:
    for request in requests:
        scheduler.add_request(request)


def import_pipeline_registry() -> Any:
    """Import `vllm_omni.config.pipeline_registry` on the CPU-only test install.

    The registry imports every model's `pipeline.py`; `auk/__init__.py` imports the AuK model,
    whose import chain needs torchvision, and PyPI's (CUDA) torchvision cannot load beside the
    CPU torch. When torchvision does not import, `vllm_omni.model_executor.models.auk` is
    pre-seeded in `sys.modules` as an empty package pointing at the real folder, so only the
    light `auk/pipeline.py` is executed. The shim stays for the rest of the process.
    """
    import importlib
    import sys
    import types

    import_vllm_omni()
    auk = "vllm_omni.model_executor.models.auk"
    if auk not in sys.modules:
        try:
            importlib.import_module("torchvision")
        except Exception:
            import vllm_omni.model_executor.models as models

            shim = types.ModuleType(auk)
            shim.__path__ = [str(Path(models.__path__[0]) / "auk")]
            sys.modules[auk] = shim
    from vllm_omni.config import pipeline_registry

    return pipeline_registry


def stage_configs_for(pipeline: Any, deploy_yaml: str | os.PathLike[str] | None = None) -> list:
    """The per-stage `StageConfig`s vLLM-Omni derives from `pipeline` + a deploy yaml.

    Uses the pipeline's bundled default deploy yaml (vllm_omni/deploy/) unless one is given;
    this is the legacy merge path (`stage_config.merge_pipeline_deploy`) that fills
    `StageConfig.scheduler_cls`.
    """
    import vllm_omni
    from vllm_omni.config.stage_config import load_deploy_config, merge_pipeline_deploy

    if deploy_yaml is None:
        deploy_yaml = (
            Path(vllm_omni.__file__).parent / "deploy" / pipeline.default_deploy_config_name
        )
    return merge_pipeline_deploy(pipeline, load_deploy_config(deploy_yaml))
