"""The plugin's version checks and start guard, against the real vLLM / vLLM-Omni modules.

* every hooked private API matches the installed vLLM 0.30.0 / vLLM-Omni 0.30.0;
* a module shaped like a newer release (vLLM 0.34: `skipped_waiting` and
  `prev_step_scheduled_req_ids` gone, `_preempt_request` without `timestamp`) is refused with
  one line naming the versions and the hook, and the refusal stops the import (the plugin's
  post-import hooks swallow other errors);
* while HorizonServe is on, an engine core resolving vLLM-Omni's own stage scheduler gets
  HorizonServe's instead, and one resolving any other scheduler refuses.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm


def _compat():
    from horizonserve.runtime.engine.vllm_omni import compat

    return compat


def test_every_hook_matches_the_installed_release() -> None:
    compat = _compat()
    checked = compat.check_importable()
    # the scheduler hooks at least (the serving modules need the full serving install)
    assert "vllm.v1.core.sched.scheduler" in checked
    assert "vllm_omni.core.sched.omni_ar_scheduler" in checked
    assert "vllm.config.scheduler" in checked
    assert compat.SUPPORTED == {"vllm": "0.30.0", "vllm-omni": "0.30.0"}


def _fake_scheduler_module() -> types.ModuleType:
    """`vllm.v1.core.sched.scheduler` as vLLM 0.34 shapes it (the parts the plugin hooks)."""
    module = types.ModuleType("vllm.v1.core.sched.scheduler")
    code = textwrap.dedent(
        """
        class Scheduler:
            def __init__(self, vllm_config):
                self.waiting = []
                self.running = []
                self.requests = {}
                self.kv_cache_manager = None
                self.max_num_running_reqs = 1
                self.policy = None

            def schedule(self): ...
            def _enqueue_waiting_request(self, request): ...
            def _preempt_request(self, request): ...
            def _free_request(self, request): ...
            def update_from_output(self, scheduler_output, model_runner_output): ...
        """
    )
    exec(compile(code, "<vllm-0.34>", "exec"), module.__dict__)
    return module


def test_a_missing_instance_attribute_is_refused_in_one_line() -> None:
    compat = _compat()
    with pytest.raises(compat.IncompatibleVersion) as info:
        compat.check(_fake_scheduler_module())
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("HorizonServe refuses to start: vLLM ")
    assert "vllm.v1.core.sched.scheduler.Scheduler" in message
    assert "skipped_waiting" in message and "prev_step_scheduled_req_ids" in message
    assert "supported: vllm 0.30.0, vllm-omni 0.30.0" in message


def test_a_changed_signature_is_refused() -> None:
    compat = _compat()
    module = _fake_scheduler_module()
    hook = next(h for h in compat.HOOKS if h.qualname == "Scheduler._preempt_request")
    assert compat.problem(hook, module) == "has no parameter timestamp"
    gone = compat.Hook(module.__name__, "Scheduler.resumed_req_ids_of", "callable", ("self",))
    assert compat.problem(gone, module) == "is gone"


def test_the_refusal_stops_the_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A post-import hook that raises anything else is logged and the import goes on; a
    version refusal propagates, so the process (and vLLM with it) does not start."""
    from horizonserve.runtime.engine.vllm_omni import hooks

    compat = _compat()
    (tmp_path / "hs_fake_hooked.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    table = (compat.Hook("hs_fake_hooked", "MISSING"),)

    def check(module: types.ModuleType) -> None:
        compat.check(module, table)

    hooks.when_imported("hs_fake_hooked", check)
    try:
        with pytest.raises(compat.IncompatibleVersion, match=r"hs_fake_hooked\.MISSING is gone"):
            importlib.import_module("hs_fake_hooked")
    finally:
        sys.modules.pop("hs_fake_hooked", None)

    (tmp_path / "hs_fake_broken_patch.py").write_text("VALUE = 2\n")

    def broken(module: types.ModuleType) -> None:
        raise ValueError("a broken patch")

    hooks.when_imported("hs_fake_broken_patch", broken)
    try:
        assert importlib.import_module("hs_fake_broken_patch").VALUE == 2
    finally:
        sys.modules.pop("hs_fake_broken_patch", None)


class _FakeSchedulerConfig:
    """The two members of vLLM's SchedulerConfig the guard touches."""

    def __init__(self, scheduler_cls: object) -> None:
        self.scheduler_cls = scheduler_cls

    def get_scheduler_cls(self) -> object:
        return self.scheduler_cls


def test_start_guard_swaps_vllm_omnis_own_schedulers_and_refuses_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AsyncOmni and the offline Omni build their stage configs before vLLM loads the plugin:
    their stages arrive with vLLM-Omni's own schedulers, which the guard swaps for
    HorizonServe's; any other scheduler is refused in one line."""
    from horizonserve.runtime.engine.vllm_omni import pipelines, start_guard

    class Config(_FakeSchedulerConfig):
        pass

    assert start_guard.install_guard(Config)
    assert not start_guard.install_guard(Config)  # idempotent
    monkeypatch.setenv("HORIZONSERVE_VLLM", "1")
    omni = "vllm_omni.core.sched.omni_ar_scheduler"
    for name, want in (
        (f"{omni}.OmniARScheduler", pipelines.AR_SCHEDULER),
        (f"{omni}.OmniARAsyncScheduler", pipelines.AR_SCHEDULER),
        ("vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler",
         pipelines.GENERATION_SCHEDULER),
    ):  # fmt: skip
        config = Config(name)
        assert config.get_scheduler_cls() == want
        assert config.scheduler_cls == want
    for path in pipelines.HORIZON_SCHEDULERS:
        assert Config(path).get_scheduler_cls() == path
    other = "vllm_omni.model_executor.models.x.scheduler.ModelScheduler"
    with pytest.raises(start_guard.StartRefused) as info:
        Config(other).get_scheduler_cls()
    assert "\n" not in str(info.value) and other in str(info.value)
    with pytest.raises(start_guard.StartRefused, match="configured with None"):
        Config(None).get_scheduler_cls()  # vLLM's default scheduler (a plain vLLM engine)
    monkeypatch.setenv("HORIZONSERVE_VLLM", "0")
    name = f"{omni}.OmniARScheduler"
    assert Config(name).get_scheduler_cls() == name  # off: vLLM-Omni as shipped


def test_the_real_scheduler_config_is_guarded_by_register(hs_env) -> None:
    """`register()` guards vLLM's own SchedulerConfig (already imported: patched at once).

    Run in a child process: `register()` patches vLLM / vLLM-Omni modules for good, and the
    other tests of this folder check those patches on unpatched classes.
    """
    code = textwrap.dedent(
        """
        from vllm.config.scheduler import SchedulerConfig
        from horizonserve.runtime.engine.vllm_omni import plugin, start_guard
        plugin.register()
        assert getattr(SchedulerConfig.get_scheduler_cls, start_guard.WRAPPED, False)
        """
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_moved_module_is_refused_at_start() -> None:
    """A hooked module that no longer exists would never be patched (silently): refused."""
    compat = _compat()
    moved = (compat.Hook("vllm.v1.worker.gpu_model_runner_v0", "graph_capture", "callable"),)
    with pytest.raises(compat.IncompatibleVersion, match="module no longer exists"):
        compat.check_present(moved)
    compat.check_present()  # the installed release has every hooked module
