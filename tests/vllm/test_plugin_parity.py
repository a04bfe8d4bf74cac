"""What the plugin does with the reference engine's default mechanisms it does not apply
(runtime/engine/vllm_omni/README.md, "Parity"): each test pins the plugin's behaviour.

Place-aware talker order acts (test_plugin_place.py), the SM split acts
(test_plugin_scheduler.py, test_plugin_worker.py, test_plugin_downstream.py); here:
`reject_late` is refused at start with the field and the fix, and playback credit is not
applied (every started stream keeps its talker step).
"""

from __future__ import annotations

import pytest
from factory import run_step
from horizon import new_ids, stamped

pytestmark = pytest.mark.vllm

SPEECH = 10


def test_reject_late_is_refused_naming_the_field_and_the_fix(hs_env):
    from horizonserve.runtime.engine.vllm_omni.settings import PluginConfigError, resolve_config

    hs_env("horizon", reject_late=True)
    with pytest.raises(PluginConfigError, match=r"control\.reject_late: .* set reject_late false"):
        resolve_config()
    hs_env("horizon")  # the default (off) serves
    assert not resolve_config().resolved().reject_late


def test_a_shared_stage_scheduler_with_reject_late_does_not_start(hs_env, make_scheduler):
    from horizonserve.runtime.engine.vllm_omni.scheduler import ar_scheduler
    from horizonserve.runtime.engine.vllm_omni.settings import PluginConfigError

    hs_env("horizon", reject_late=True)
    with pytest.raises(PluginConfigError, match="reject_late"):
        make_scheduler("omni_ar", scheduler_cls=ar_scheduler)


def test_started_streams_keep_their_talker_step(hs_env, make_scheduler, clock):
    """No playback credit: a request waiting for its first chunk joins the batch beside the
    started streams, which all still decode in that step (the reference talker would let a
    stream holding more than `playback_margin_s` of audio sit it out)."""
    from horizonserve.runtime.engine.vllm_omni.scheduler import ar_scheduler

    config = hs_env("horizon")
    sched = make_scheduler(
        "omni_ar", scheduler_cls=ar_scheduler, stage_id=1, model_stage="talker", max_num_seqs=3
    )
    sched._hs_down.clock_ns = clock
    for rid in ("R1", "R2"):
        sched.add_request(stamped(config, rid, 6, SPEECH, clock.now_ns, max_tokens=400))
    for _ in range(200):  # far ahead of any listener: 200 codec steps each
        run_step(sched)
        clock.advance(0.001)
    sched.add_request(stamped(config, "N", 6, SPEECH, clock.now_ns, max_tokens=40))
    out, _ = run_step(sched)
    assert new_ids(out) == ["N"]
    assert {"R1", "R2"} <= set(out.num_scheduled_tokens)
