"""Place-aware admission at the talker (stage 1) of the REAL vLLM-Omni AR scheduler (CPU), and
the answer lengths it reads from the shared stage (`shared.AnswerLengths`).

The talker learns its seconds per answer token from the requests it finished (admission to
finish over their answer length) and, once its places cannot take every waiting request,
admits in the control core's place-aware order: a long answer whose deadline comes first goes
behind a short one it would make miss, when both still start in time that way.

Classes (conftest.hs_config): `speech` (priority 10), SLO 9.0 s, downstream estimate 0.153 s,
so at the talker a request is late once now > arrival + 8.847 s.
"""

from __future__ import annotations

from typing import Any

import pytest
from factory import run_step
from horizon import new_ids, stamped

pytestmark = pytest.mark.vllm

SPEECH, TEXT = 10, 0
STEP_S = 0.01
LATE_AT_S = 9.0 - 0.153  # arrival → late at the talker


@pytest.fixture
def talker(hs_env, make_scheduler, clock):
    from horizonserve.runtime.engine.vllm_omni.scheduler import ar_scheduler

    def build(**params: Any) -> tuple[Any, Any]:
        config = hs_env("horizon")
        sched = make_scheduler(
            "omni_ar", scheduler_cls=ar_scheduler, stage_id=1, model_stage="talker", **params
        )
        sched._hs_down.clock_ns = clock
        return sched, config

    return build


def _arrive(sched: Any, config: Any, clock: Any, rid: str, late_in_s: float, n: int, answer: int):
    """A talker request late in `late_in_s`, `n` codec tokens to make, whose thinker answer
    had `answer` tokens (0: none recorded)."""
    from horizonserve.runtime.engine.vllm_omni import shared

    if answer:
        shared.answer_lengths().record(rid, answer)
    arrival = clock.now_ns - int((LATE_AT_S - late_in_s) * 1e9)
    sched.add_request(stamped(config, rid, 6, SPEECH, arrival, max_tokens=n))


def _step(sched: Any, clock: Any) -> list[str]:
    out, _ = run_step(sched)
    clock.advance(STEP_S)
    return new_ids(out)


def _one_place_with_a_choice(talker: Any, clock: Any, *, lengths: bool) -> tuple[Any, list]:
    """One place. W0 (20 tokens, answer 20) teaches the talker 0.01 s per answer token; R1
    (answer 100) then holds the place ≈ 1 s; X (answer 300, late in 1.5 s) and Y (answer 5,
    late in 2.0 s) wait. Deadline order: X at ≈ 1 s, Y after X's 3 s (missed). Place order: Y
    at ≈ 1 s, X at ≈ 1.05 s: both in time."""
    sched, config = talker(max_num_seqs=1)
    _arrive(sched, config, clock, "W0", 30.0, 20, 20 if lengths else 0)
    while sched.has_unfinished_requests():
        _step(sched, clock)
    _arrive(sched, config, clock, "R1", 30.0, 100, 100 if lengths else 0)
    assert _step(sched, clock) == ["R1"]
    _arrive(sched, config, clock, "X", 1.5, 300, 300 if lengths else 0)
    _arrive(sched, config, clock, "Y", 2.0, 5, 5 if lengths else 0)
    order: list[str] = []
    for _ in range(140):
        order += _step(sched, clock)
        if len(order) == 2:
            break
    return sched, order


def test_the_talker_learns_its_pace_and_admits_by_places(talker, clock):
    sched, order = _one_place_with_a_choice(talker, clock, lengths=True)
    admission = sched.hs_admission
    assert admission.place and admission.work_samples >= 1
    assert admission.s_per_work == pytest.approx(STEP_S, rel=0.15)
    assert order == ["Y", "X"]
    assert admission.place_steps > 0 and admission.late_admitted == 0


def test_without_answer_lengths_the_talker_keeps_deadline_order(talker, clock):
    """A streaming thinker hands off before it finishes: no length, no place order (the
    request keeps its deadline place). Y then misses behind X."""
    sched, order = _one_place_with_a_choice(talker, clock, lengths=False)
    assert order == ["X"]  # Y still waits for X's 300 tokens
    assert sched.hs_admission.place_steps == 0


def test_the_shared_stage_records_long_path_answer_lengths(build, clock):
    """Finished speech answers are recorded for the talker (taken once); text answers and
    aborted requests are not."""
    from vllm.v1.request import RequestStatus

    from horizonserve.runtime.engine.vllm_omni import shared

    sched, config = build(max_num_seqs=4)
    for rid, prio, n in (("L0", SPEECH, 7), ("S1", TEXT, 3), ("L2", SPEECH, 50)):
        sched.add_request(stamped(config, rid, 8, prio, clock.now_ns, max_tokens=n))
    for _ in range(12):
        run_step(sched)
    sched.finish_requests(["L2"], RequestStatus.FINISHED_ABORTED)
    answers = shared.answer_lengths()
    assert answers.take("L0") == 7
    assert answers.take("L0") is None  # taken once
    assert answers.take("S1") is None and answers.take("L2") is None


def test_a_full_answer_table_drops_the_record_and_counts_it(tmp_path):
    from horizonserve.runtime.engine.vllm_omni.shared import AnswerLengths
    from horizonserve.runtime.monitor import RequestTable

    answers = AnswerLengths(RequestTable.create(tmp_path / "answers", capacity=2))
    assert answers.record("a", 10) and answers.record("b", 2**40)
    assert not answers.record("c", 5) and answers.dropped == 1
    assert answers.take("b") == AnswerLengths.MAX_TOKENS  # clamped to the i32 field
    assert answers.record("c", 5) and answers.take("c") == 5
    answers.close()


def test_a_killed_servers_answer_table_is_removed_at_the_next_start(hs_env, tmp_path):
    import struct

    from horizonserve.runtime.engine.vllm_omni import shared
    from horizonserve.runtime.monitor import RequestTable

    stale = tmp_path / f"{shared.ANSWERS_PREFIX}-dead-1"
    RequestTable.create(stale).close()
    with open(stale, "r+b") as f:  # creator pid (header field 6, offset 40): none alive
        f.seek(40)
        f.write(struct.pack("@q", 2**31 - 7))
    shared.create_fresh()
    try:
        assert not stale.exists() and shared.answers_path().exists()
    finally:
        shared.reset_for_tests()
        for path in (shared.record_path(), shared.table_path(), shared.answers_path()):
            path.unlink(missing_ok=True)
