"""Worker-side hooks: the stage's Green Context before each forward pass, diffusion activity.

SM control (`SmControl`): each stage worker pre-allocates one Green Context per SM level it can
be given (`runtime.gpu.SmLadderContexts`, stream mode, plus a Green Context of the whole GPU)
once its device is set, and before every forward pass reads the shared stage's last decision
from the control record (one seqlock read) and activates the matching level. Activating a level
makes its stream current through `torch.cuda.set_stream`, which vLLM patches to track its own
`current_stream()`, so the model runner's kernels (and CUDA-graph replays) go to that stream.

* the shared stage (stage 0) takes `shared_sms` (S_aggr until the first decision): the cap,
  or S_aggr for a forward that prefills an urgent prompt (urgent-prefill boost, see
  `scheduler.py`);
* a downstream stage takes `downstream_sms` on the complementary SMs (partition "complement":
  disjoint from the shared stage's at every cap); it follows the published headroom, never
  `shared_sms`, so a boosted shared forward (which overlaps its SMs, shared as MPS clients)
  does not move it. It never goes below its guaranteed S_tot − S_cap: at S_aggr the headroom
  published is S_tot − S_aggr (0 by default), when the shared stage is backlogged (level
  LIFTED) or has not yet seen this stage active, and the shared stage then overlaps those SMs
  as MPS clients instead of taking them. While the shared stage is idle (its decision older
  than `HORIZONSERVE_VLLM_MAX_AGE_S`) it takes the whole GPU.

CUDA graphs: vLLM captures inside `graph_capture()`, which makes a fresh side stream of the
primary context current, so entering a level is not enough. During `compile_or_warm_up_model`
the worker enters the capture level (`HORIZONSERVE_VLLM_CAPTURE_LEVEL`: `cap` = S_cap for the
shared stage / its complement downstream, the default; `aggressive`; `full`) and hands that
level's Green Context stream to `graph_capture()` (`capture_on`), so the graphs are captured
on it. Whether a replay then keeps the capture level's SMs or follows the stream it is
launched on is a property of the driver (see README.md, "Not covered"); capturing at S_cap is
right either way for decode, which is near its best there. Eager steps (prefills; Qwen2.5-Omni
and MiMo-Audio run eager) follow the ladder step by step.

Where there is no CUDA device, or Green Contexts are missing, nothing is capped and one line
is logged. Green Contexts split SMs only between kernels that run at the same time: separate
stage processes time-slice the GPU unless they are MPS clients (`HORIZONSERVE_VLLM_MPS=1`).

Diffusion activity (`DiffusionActivity`): BAGEL's DiT stage has no vLLM scheduler, so its
engine's `step_streaming` is wrapped to count requests in flight, published into the stage's
slot with a heartbeat every 0.5 s while it runs long denoising loops.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from horizonserve.runtime.config import ServingConfig
from horizonserve.runtime.engine.vllm_omni import shared
from horizonserve.runtime.engine.vllm_omni.settings import Knobs, resolve_config
from horizonserve.runtime.gpu.split import StageLadder
from horizonserve.runtime.monitor import ControlRecord
from horizonserve.runtime.spatial import NO_DECISION

log = logging.getLogger(__name__)

WRAPPED = "__horizonserve_wrapped__"
SHARED = "shared"
DOWNSTREAM = "downstream"
HEARTBEAT_S = 0.5
KIND_DIFFUSION = 3


class SmControl:
    """One stage process's SM ladder, switched from the control record before each forward."""

    def __init__(
        self,
        role: str,
        config: ServingConfig,
        record: ControlRecord,
        *,
        knobs: Knobs | None = None,
        device_index: int = 0,
        backend_factory: Any = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        from horizonserve.runtime.gpu import SmLadderContexts

        if role not in (SHARED, DOWNSTREAM):
            raise ValueError(f"role must be {SHARED!r} or {DOWNSTREAM!r}, got {role!r}")
        self.role = role
        self.record = record
        self.knobs = knobs or Knobs()
        self.clock_ns = clock_ns
        self.max_age_ns = int(self.knobs.max_age_s * 1e9)
        ladder = config.ladder
        self.total = ladder.total
        self.aggressive = ladder.aggressive
        self.s_cap = ladder.s_cap
        # The one split rule both engines follow (runtime.gpu.split).
        self.split = StageLadder.open(role, ladder)
        self.guaranteed = self.split.guaranteed
        shared_levels = sorted({*ladder.levels, ladder.aggressive})
        # SM count this process runs on, for each SM count the shared stage may be given.
        self.own: dict[int, int] = {
            s: (s if role == SHARED else self.complement(s)) for s in shared_levels
        }
        self.contexts = SmLadderContexts(
            [*self.split.contexts, self.total],
            device_index,
            mode="stream",
            backend_factory=backend_factory,
            partition="first" if role == SHARED else "complement",
            full_level="green",
        )
        self.index = {sms: i for i, sms in enumerate(self.contexts.levels)}
        self.full_index = len(self.contexts.levels) - 1
        self.available = self.contexts.available
        self.activations = 0

    def complement(self, shared_sms: int) -> int:
        """Downstream SMs when the shared stage holds `shared_sms` (never below the guarantee)."""
        return max(self.total - shared_sms, self.guaranteed)

    def target_sms(self, decision: Any, now_ns: int) -> int:
        """SMs this process should run on given the shared stage's last published decision
        (`StageLadder.sms_for`; a downstream stage treats an old decision as none)."""
        fresh = decision.steps != 0 and (
            self.role == SHARED or now_ns - decision.heartbeat_ns <= self.max_age_ns
        )
        level = decision.level_index if fresh else NO_DECISION
        sms = self.split.sms_for(level, decision.shared_sms, decision.downstream_sms)
        return self.total if sms is None else sms

    def activate_sms(self, sms: int) -> None:
        snapped = self.split.snap(sms)  # the one fallback: snap down, never the whole GPU
        self.contexts.activate(self.full_index if snapped is None else self.index[snapped])
        self.activations += 1

    def before_forward(self) -> None:
        self.activate_sms(self.target_sms(self.record.read_decision(), self.clock_ns()))

    def capture_sms(self) -> int:
        level = self.knobs.capture_level
        if level == "full":
            return self.total
        shared_sms = self.s_cap if level == "cap" else self.aggressive
        return self.own.get(shared_sms, self.total)

    def enter_capture(self) -> None:
        """Before CUDA-graph capture: make the capture level's stream current."""
        self.activate_sms(self.capture_sms())

    def capture(self) -> AbstractContextManager[Any]:
        """Enter the capture level; the returned context makes vLLM capture on its stream."""
        self.enter_capture()
        if not self.available:
            return nullcontext()
        import torch

        return capture_on(torch.cuda.current_stream())


# Modules that call vLLM's `graph_capture()` (imported by name) around CUDA-graph capture.
GRAPH_CAPTURE_USERS = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.cudagraph_utils")


@contextmanager
def capture_on(stream: Any) -> Iterator[None]:
    """Make vLLM's `graph_capture()` capture on `stream` instead of a fresh side stream."""
    from vllm.distributed.parallel_state import GraphCaptureContext

    patched = []
    for name in GRAPH_CAPTURE_USERS:
        module = sys.modules.get(name)
        orig = getattr(module, "graph_capture", None) if module is not None else None
        if orig is None:
            continue

        def graph_capture(device: Any, graph_capture_context: Any = None, _orig: Any = orig) -> Any:
            return _orig(device, graph_capture_context or GraphCaptureContext(stream))

        module.graph_capture = graph_capture
        patched.append((module, orig))
    try:
        yield
    finally:
        for module, orig in patched:
            module.graph_capture = orig


_no_cuda_logged = False


def build_sm_control(role: str, hint: str | None = None) -> SmControl | None:
    """The SM control of this worker process, or None (off, no CUDA, no Green Contexts)."""
    global _no_cuda_logged
    knobs = Knobs.from_env()
    if not knobs.sm_control:
        return None
    try:
        import torch

        cuda = torch.cuda.is_available()
    except Exception:  # torch without CUDA support
        cuda = False
    if not cuda:
        if not _no_cuda_logged:
            _no_cuda_logged = True
            log.info("HorizonServe: no CUDA device in this worker; SM caps are not applied")
        return None
    control = SmControl(
        role,
        resolve_config(hint),
        shared.control_record(),
        knobs=knobs,
        device_index=torch.cuda.current_device(),
    )
    log.info(
        "HorizonServe: %s stage SM ladder %s (available %s, capture at %d SMs)",
        role,
        list(control.contexts.levels),
        control.available,
        control.capture_sms(),
    )
    return control


def _role_of_vllm_worker(worker: Any) -> tuple[str, str | None]:
    model_config = worker.vllm_config.model_config
    stage_id = int(getattr(model_config, "stage_id", 0) or 0)
    hint = getattr(getattr(model_config, "hf_config", None), "model_type", None)
    return (SHARED if stage_id == 0 else DOWNSTREAM), hint


def _role_of_diffusion_worker(worker: Any) -> tuple[str, str | None]:
    return DOWNSTREAM, None


def install_worker(
    cls: Any,
    *,
    forward_methods: tuple[str, ...] = ("execute_model",),
    capture_method: str | None = "compile_or_warm_up_model",
    role_of: Callable[[Any], tuple[str, str | None]] = _role_of_vllm_worker,
    build: Callable[[str, str | None], SmControl | None] = build_sm_control,
) -> bool:
    """Patch a worker class: build the ladder after `init_device`, activate before forwards."""
    if getattr(cls.init_device, WRAPPED, False):
        return False
    orig_init = cls.init_device

    @functools.wraps(orig_init)
    def init_device(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = orig_init(self, *args, **kwargs)
        role, hint = role_of(self)
        self._hs_sm = build(role, hint)
        return result

    setattr(init_device, WRAPPED, True)
    cls.init_device = init_device

    for name in forward_methods:
        orig = getattr(cls, name, None)
        if orig is None:
            continue

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(orig)
            def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
                control = self.__dict__.get("_hs_sm")
                if control is not None:
                    control.before_forward()
                return orig(self, *args, **kwargs)

            return forward

        setattr(cls, name, make(orig))

    if capture_method is not None and hasattr(cls, capture_method):
        orig_capture = getattr(cls, capture_method)

        @functools.wraps(orig_capture)
        def capture(self: Any, *args: Any, **kwargs: Any) -> Any:
            control = self.__dict__.get("_hs_sm")
            if control is None:
                return orig_capture(self, *args, **kwargs)
            with control.capture():
                return orig_capture(self, *args, **kwargs)

        setattr(cls, capture_method, capture)
    return True


def install_ar_worker(cls: Any) -> bool:
    return install_worker(cls)


def install_generation_worker(cls: Any) -> bool:
    return install_worker(cls)


def install_diffusion_worker(cls: Any) -> bool:
    return install_worker(
        cls,
        forward_methods=("execute_model", "execute_model_batch", "execute_stepwise"),
        capture_method=None,
        role_of=_role_of_diffusion_worker,
    )


# -- diffusion activity --------------------------------------------------------------------------


class DiffusionActivity:
    """Requests in flight in a diffusion stage, published into its downstream slot."""

    def __init__(
        self,
        record: ControlRecord,
        stage_id: int,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        slot = max(0, min(stage_id - 1, shared.N_SLOTS - 1))
        self.writer = record.downstream_writer(slot, KIND_DIFFUSION)
        self.in_flight = 0
        self.heartbeat_s = heartbeat_s
        self.clock_ns = clock_ns
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.writer.set_active(0, clock_ns())

    def begin(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.writer.set_active(self.in_flight, self.clock_ns())
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._beat, name="horizonserve-dit-heartbeat", daemon=True
                )
                self._thread.start()

    def end(self) -> None:
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)
            self.writer.set_active(self.in_flight, self.clock_ns())

    def _beat(self) -> None:
        while True:
            time.sleep(self.heartbeat_s)
            with self._lock:
                self.writer.set_active(self.in_flight, self.clock_ns())


_activity: DiffusionActivity | None = None
_activity_lock = threading.Lock()


def diffusion_activity(stage_id: int) -> DiffusionActivity:
    global _activity
    with _activity_lock:
        if _activity is None:
            _activity = DiffusionActivity(shared.control_record(), stage_id)
        return _activity


def wrap_step_streaming(
    orig: Callable[..., Any], activity: Callable[[Any], DiffusionActivity] | None = None
) -> Callable[..., Any]:
    """Wrap `DiffusionEngine.step_streaming(self, request)` (an async generator function)."""

    def default_activity(engine: Any) -> DiffusionActivity:
        stage_id = int(getattr(getattr(engine, "od_config", None), "stage_id", 1) or 1)
        return diffusion_activity(stage_id)

    get_activity = activity or default_activity

    @functools.wraps(orig)
    async def step_streaming(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        act = get_activity(self)
        act.begin()
        gen = orig(self, *args, **kwargs)
        try:
            async for item in gen:
                yield item
        finally:
            await gen.aclose()
            act.end()

    setattr(step_streaming, WRAPPED, True)
    return step_streaming


def install_diffusion_engine(cls: Any) -> bool:
    if getattr(cls.step_streaming, WRAPPED, False):
        return False
    cls.step_streaming = wrap_step_streaming(cls.step_streaming)
    return True
