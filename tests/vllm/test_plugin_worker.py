"""Worker-side hooks: Green Context level per forward pass, capture level, diffusion activity.

On CPU nothing can be capped: `build_sm_control` returns None (the no-GPU fallback, tested
with the real path). The level *selection* — which ladder level the shared and downstream
workers activate for each published decision, before capture, when the shared stage is idle —
is tested through `SmControl` with a fake Green Context backend; that the kernels really run
on those SMs needs a GPU (see README.md, "What is not covered").
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from factory import import_pipeline_registry

pytestmark = pytest.mark.vllm


class FakeLevel:
    def __init__(self, log: list, sms: int) -> None:
        self.log, self.granted_sms = log, sms

    def switch_from(self, prev: Any) -> None:
        self.log.append(self.granted_sms)

    def leave(self) -> None:
        self.log.append("leave")

    def close(self) -> None:
        pass


class FakeBackend:
    mode = "stream"

    def __init__(self, total: int, log: list) -> None:
        self.total_sms, self.log = total, log

    def make_level(self, num_sms: int) -> FakeLevel:
        return FakeLevel(self.log, min(num_sms, self.total_sms))


@pytest.fixture
def record(hs_env):
    from horizonserve.runtime.engine.vllm_omni import shared

    return shared.control_record()


def control(role: str, record: Any, clock: Any, **knobs: Any) -> tuple[Any, list]:
    from horizonserve.runtime.engine.vllm_omni.settings import Knobs, resolve_config
    from horizonserve.runtime.engine.vllm_omni.worker import SmControl

    log: list = []
    config = resolve_config()  # default ladder: levels [32, 48, 64, 80], S_aggr = S_tot = 132
    sm = SmControl(
        role,
        config,
        record,
        knobs=Knobs(**knobs),
        backend_factory=lambda device, mode: FakeBackend(config.ladder.total, log),
        clock_ns=clock,
    )
    return sm, log


def test_shared_stage_follows_the_published_decision(record, clock):
    sm, log = control("shared", record, clock)
    assert sm.available and list(sm.contexts.levels) == [32, 48, 64, 80, 132]
    sm.before_forward()  # nothing published yet: the aggressive level (the whole GPU here)
    writer = record.decision_writer()
    writer.publish(48, 84, 1, 0.5, 0.5, clock.now_ns)
    sm.before_forward()
    writer.publish(80, 52, 3, 0.9, 0.9, clock.now_ns)
    sm.before_forward()
    sm.before_forward()  # same level again: no switch
    assert log == [132, 48, 80]
    assert sm.contexts.switches == 3


def test_downstream_stage_takes_the_complement_and_the_whole_gpu_when_the_thinker_idles(
    record, clock
):
    sm, log = control("downstream", record, clock)
    # 132 - {80, 64, 48, 32}, and the whole GPU; at S_aggr the guaranteed 132 - S_cap = 52
    assert list(sm.contexts.levels) == [52, 68, 84, 100, 132]
    sm.before_forward()  # no decision yet: whole GPU
    writer = record.decision_writer()
    writer.publish(48, 84, 1, 0.5, 0.5, clock.now_ns)
    sm.before_forward()
    writer.publish(132, 0, -1, 0.1, 0.1, clock.now_ns)  # no downstream work: thinker at S_aggr
    sm.before_forward()  # (this stage became active since): its guaranteed S_tot - S_cap
    clock.advance(3.0)  # thinker idle longer than HORIZONSERVE_VLLM_MAX_AGE_S (2 s)
    sm.before_forward()
    writer.publish(132, 132, -2, 0.1, 0.1, clock.now_ns)  # uncapped baseline policy
    sm.before_forward()
    assert log == [132, 84, 52, 132]  # 52: S_tot - S_cap while the thinker holds every SM
    assert sm.target_sms(record.read_decision(), clock.now_ns) == 132


def test_a_boosted_forward_moves_the_shared_stage_only(record, clock):
    """Urgent-prefill boost: the shared stage publishes S_aggr for one forward with the cap's
    headroom and level; the downstream stage keeps following the headroom."""
    shared_sm, shared_log = control("shared", record, clock)
    down_sm, down_log = control("downstream", record, clock)
    writer = record.decision_writer()
    for shared_sms in (80, 132, 80):  # capped, boosted (level 3 still), capped
        writer.publish(shared_sms, 52, 3, 0.9, 0.9, clock.now_ns)
        shared_sm.before_forward()
        down_sm.before_forward()
    assert shared_log == [80, 132, 80]
    assert down_log == [52]  # one switch: from the whole GPU to the complement of the cap


def test_a_lifted_shared_stage_leaves_the_downstream_its_guaranteed_sms(record, clock):
    """Backlog lift: the shared stage publishes S_aggr with level LIFTED (-3) and headroom
    S_tot − S_aggr = 0; the downstream stage keeps S_tot − S_cap instead of dropping to the
    8-SM floor (the two overlap as MPS clients)."""
    shared_sm, shared_log = control("shared", record, clock)
    down_sm, down_log = control("downstream", record, clock)
    writer = record.decision_writer()
    for decision in ((80, 52, 3), (132, 0, -3), (132, 0, -3), (64, 68, 2)):
        writer.publish(*decision, 0.9, 0.9, clock.now_ns)
        shared_sm.before_forward()
        down_sm.before_forward()
        assert down_sm.target_sms(record.read_decision(), clock.now_ns) >= 52
    assert shared_log == [80, 132, 64]
    assert down_log == [52, 68]  # no switch while lifted


@pytest.mark.parametrize(
    ("level", "shared_sms", "downstream_sms"),
    [("cap", 80, 52), ("aggressive", 132, 52), ("full", 132, 132)],
)
def test_capture_level(record, clock, level, shared_sms, downstream_sms):
    shared_ctl, _ = control("shared", record, clock, capture_level=level)
    down_ctl, _ = control("downstream", record, clock, capture_level=level)
    assert shared_ctl.capture_sms() == shared_sms
    assert down_ctl.capture_sms() == downstream_sms


def test_no_gpu_fallback_builds_nothing(hs_env):
    from horizonserve.runtime.engine.vllm_omni.worker import build_sm_control

    assert build_sm_control("shared") is None
    assert build_sm_control("downstream") is None


class StubWorker:
    """The three methods the hook wraps, recording the order of events."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.vllm_config = None

    def init_device(self) -> None:
        self.events.append("init_device")

    def compile_or_warm_up_model(self) -> str:
        self.events.append("capture")
        return "graphs"

    def execute_model(self, scheduler_output: Any) -> str:
        self.events.append("forward")
        return "out"


class RecordingControl:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def before_forward(self) -> None:
        self.events.append("level")

    def capture(self) -> Any:
        from contextlib import contextmanager

        @contextmanager
        def ctx() -> Any:
            self.events.append("capture-level")
            yield
            self.events.append("capture-done")

        return ctx()


def test_worker_hook_enters_the_level_before_capture_and_each_forward(monkeypatch):
    from horizonserve.runtime.engine.vllm_omni.worker import install_worker

    for name in ("init_device", "compile_or_warm_up_model", "execute_model"):
        monkeypatch.setattr(StubWorker, name, getattr(StubWorker, name))
    built: list[tuple] = []

    def build(role: str, hint: str | None) -> RecordingControl:
        built.append((role, hint))
        return RecordingControl(worker.events)

    assert install_worker(StubWorker, role_of=lambda w: ("shared", "qwen2_5_omni"), build=build)
    assert not install_worker(StubWorker, build=build)  # idempotent
    worker = StubWorker()
    worker.init_device()
    assert worker.compile_or_warm_up_model() == "graphs"
    assert worker.execute_model(None) == "out"
    assert worker.execute_model(None) == "out"
    assert built == [("shared", "qwen2_5_omni")]
    assert worker.events == [
        "init_device",
        "capture-level",
        "capture",
        "capture-done",
        "level",
        "forward",
        "level",
        "forward",
    ]


def test_hooks_install_on_the_real_worker_classes(hs_env, monkeypatch):
    import_pipeline_registry()
    from vllm.v1.worker.gpu_worker import Worker as GPUWorker
    from vllm_omni.worker.gpu_ar_worker import GPUARWorker
    from vllm_omni.worker.gpu_generation_worker import GPUGenerationWorker

    from horizonserve.runtime.engine.vllm_omni import worker as hs_worker

    for cls in (GPUARWorker, GPUGenerationWorker):
        for name in ("init_device", "execute_model", "compile_or_warm_up_model"):
            monkeypatch.setattr(cls, name, getattr(cls, name))
    assert hs_worker.install_ar_worker(GPUARWorker)
    assert hs_worker.install_generation_worker(GPUGenerationWorker)
    assert getattr(GPUARWorker.init_device, hs_worker.WRAPPED)
    # vLLM's capture runs inside compile_or_warm_up_model (the hook's capture point), and the
    # forward is execute_model; the base class itself is left alone.
    assert GPUARWorker.execute_model is not GPUWorker.execute_model
    assert "capture_model" in Path(inspect_file(GPUWorker)).read_text(encoding="utf-8")


def inspect_file(obj: Any) -> str:
    import inspect

    return inspect.getsourcefile(obj)


def test_diffusion_worker_methods_exist():
    """The diffusion worker needs cache_dit to import on CPU; pin its methods from source."""
    root = Path(importlib.util.find_spec("vllm_omni").submodule_search_locations[0])
    tree = ast.parse((root / "diffusion" / "worker" / "diffusion_worker.py").read_text("utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DiffusionWorker")
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert {"init_device", "execute_model", "execute_model_batch", "execute_stepwise"} <= names


def test_diffusion_activity_marks_the_slot_while_requests_run(record, clock, monkeypatch):
    import_pipeline_registry()
    from vllm_omni.diffusion.diffusion_engine import DiffusionEngine

    from horizonserve.runtime.engine.vllm_omni import worker as hs_worker

    monkeypatch.setattr(DiffusionEngine, "step_streaming", DiffusionEngine.step_streaming)
    assert hs_worker.install_diffusion_engine(DiffusionEngine)
    assert not hs_worker.install_diffusion_engine(DiffusionEngine)

    activity = hs_worker.DiffusionActivity(record, stage_id=1, heartbeat_s=60, clock_ns=clock)
    seen: list[int] = []

    class Engine:
        async def step_streaming(self, request: Any):
            for i in range(3):
                seen.append(record.read_downstream(0).active)
                yield [i]

    Engine.step_streaming = hs_worker.wrap_step_streaming(
        Engine.step_streaming, activity=lambda engine: activity
    )

    async def run() -> list:
        return [x async for x in Engine().step_streaming("req")]

    assert asyncio.run(run()) == [[0], [1], [2]]
    assert seen == [1, 1, 1]
    assert record.read_downstream(0).active == 0
    assert record.downstream_active_total(clock.now_ns, 2_000_000_000) == 0


def test_capture_on_hands_the_level_stream_to_vllms_graph_capture(monkeypatch):
    """vLLM's graph_capture() would make a fresh side stream current; the hook passes ours."""
    import sys
    import types

    from vllm.distributed.parallel_state import GraphCaptureContext

    from horizonserve.runtime.engine.vllm_omni.worker import GRAPH_CAPTURE_USERS, capture_on

    seen = []

    def graph_capture(device: Any, graph_capture_context: Any = None) -> str:
        seen.append(graph_capture_context)
        return "ctx"

    fake = types.ModuleType(GRAPH_CAPTURE_USERS[0])
    fake.graph_capture = graph_capture
    monkeypatch.setitem(sys.modules, GRAPH_CAPTURE_USERS[0], fake)
    stream = object()
    with capture_on(stream):
        assert fake.graph_capture("cuda:0") == "ctx"
        explicit = GraphCaptureContext(object())
        fake.graph_capture("cuda:0", explicit)
    assert fake.graph_capture is graph_capture  # restored
    assert isinstance(seen[0], GraphCaptureContext) and seen[0].stream is stream
    assert seen[1] is explicit  # an explicit context is respected
    # The real capture call sites still call graph_capture(device=...) by that name.
    root = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])
    source = (root / "v1" / "worker" / "gpu_model_runner.py").read_text(encoding="utf-8")
    assert "with self._freeze_gc(), graph_capture(device=self.device):" in source
