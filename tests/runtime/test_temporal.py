"""Temporal control: rotation, slack guard, long-path cap and exact restore."""

from __future__ import annotations

from dataclasses import dataclass
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horizonserve.runtime import temporal
from horizonserve.runtime.config import ControlParams, LateRule, Rotation, ViewOrder
from horizonserve.runtime.profiler import RequestProfiler, RequestSignals
from horizonserve.runtime.temporal import (
    MEMBERS_LONG_MAX,
    Phase,
    StepView,
    TemporalScheduler,
    restore,
    rotation_n,
)
from tests.runtime.builders import make_slo

CLASSES = ("text", "audio-out", "image-out")


def _ident(sig: RequestSignals) -> RequestSignals:
    return sig


@dataclass
class Queue:
    """A waiting queue kept next to the scheduler's index, the way an engine keeps one."""

    sched: TemporalScheduler
    profiler: RequestProfiler
    items: list[RequestSignals]

    def add(self, cls: str, arrival: float, *, prefilled: bool = False) -> RequestSignals:
        sig = self.profiler.annotate(f"r{len(self.items)}", arrival, class_name=cls)
        if prefilled:
            sig.record_progress(prefilled=True, decoded=1)
        self.items.append(sig)
        self.sched.add(sig, arrival)
        return sig

    def take(self, sig: RequestSignals) -> None:
        self.items.remove(sig)
        self.sched.remove(sig)

    def churn(self, op: str, pick: int, now: float, *, prefilled: bool) -> None:
        """A property test's queue op on the picked request: "take" it or "requeue" it."""
        sig = self.items[pick % len(self.items)]
        if op == "take":
            self.take(sig)
        else:
            self.requeue(sig, now, prefilled=prefilled)

    def requeue(self, sig: RequestSignals, now: float, *, prefilled: bool) -> None:
        """Back to the tail of the queue, e.g. preempted (a decode continuation if prefilled)."""
        self.take(sig)
        if prefilled and not sig.prefilled:
            sig.record_progress(prefilled=True, decoded=1)
        self.items.append(sig)
        self.sched.add(sig, now)


def scheduler(
    control: ControlParams,
    *,
    rotation: bool = True,
    edf: bool = False,
    by_priority: bool = False,
    late_yield: bool = False,
    deadline_order: bool = False,
) -> TemporalScheduler:
    """A scheduler on `control`'s numbers with the axes these tests name: rotation, the view
    order, and late yielding (`control.late` says whether it yields a phase, or protects)."""
    if control.late is LateRule.PROTECT:
        late = LateRule.PROTECT
    elif late_yield:
        late = control.late if control.late is not LateRule.COMPETE else LateRule.YIELD_PHASE
    else:
        late = LateRule.COMPETE
    order = (
        ViewOrder.DEADLINE
        if edf or deadline_order
        else ViewOrder.PRIORITY
        if by_priority
        else ViewOrder.ARRIVAL
    )
    axes = {
        "rotation": Rotation.PATH if rotation else Rotation.OFF,
        "view_order": order,
        "late": late,
    }
    return TemporalScheduler(ControlParams.model_validate({**control.model_dump(), **axes}))


def make_queue(control: ControlParams | None = None, **kw: bool) -> Queue:
    control = control or ControlParams()
    return Queue(
        scheduler(control, **kw),
        RequestProfiler(make_slo(), control.u_guard),
        [],
    )


def oracle_visible(
    view: StepView, items: list[RequestSignals], now: float, cap: int, late_yield: bool = False
) -> list:
    """Visibility (and view order) from the definitions, recomputed from scratch."""
    # Protected from protect_at until the deadline; late requests compete as ordinary ones,
    # and with late_yield after every on-time one (the long-path cap too).
    protected = {id(s) for s in items if not s.prefilled and s.protect_at < now <= s.deadline}

    def late(s: RequestSignals) -> bool:
        return late_yield and not s.prefilled and now > s.deadline

    ordinary_long = sorted(
        (s for s in items if s.long_path and not s.prefilled and id(s) not in protected),
        key=lambda s: (late(s), s.deadline, s.seq),
    )
    capped = {id(s) for s in ordinary_long[:cap]}

    def visible(s: RequestSignals) -> bool:
        if s.prefilled or id(s) in protected or view.phase is Phase.ALL:
            return True
        if view.phase is Phase.SHORT:
            return not s.long_path
        return s.long_path and id(s) in capped

    return sorted((s for s in items if visible(s)), key=late)  # stable: queue order within


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "take", "step"]),
        st.sampled_from(CLASSES),
        st.booleans(),  # decode continuation (preempted) when adding
        st.floats(min_value=0.0, max_value=0.5),  # time advance
        st.integers(min_value=0, max_value=1000),  # which request to take
    ),
    min_size=1,
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, cap=st.integers(min_value=0, max_value=3), late_yield=st.booleans())
def test_view_matches_definitions(ops: list, cap: int, late_yield: bool) -> None:
    """Incremental index == brute force; protected/continuations never hidden; EDF cap; with
    late_yield, late prefills after the on-time ones and last in line for the cap."""
    q = make_queue(ControlParams(long_path_cap=cap), late_yield=late_yield)
    now = 0.0
    for op, cls, prefilled, dt, pick in ops:
        now += dt
        if op == "add":
            q.add(cls, now, prefilled=prefilled)
        elif op == "take" and q.items:
            q.take(q.items[pick % len(q.items)])
        else:
            view = q.sched.plan(now)
            visible, hidden = view.split(q.items, _ident)
            assert visible == oracle_visible(view, q.items, now, cap, late_yield)
            assert view.late == sum(now > s.deadline and not s.prefilled for s in visible) * (
                late_yield
            )
            assert list(view.iter_visible(q.items, _ident)) == visible
            assert list(view.iter_visible(q.items, _ident, _ident)) == visible
            assert view.visible == len(visible)
            for s in hidden:
                assert not s.prefilled
                assert not s.is_protected(now) or now > s.deadline
            # Work conservation: a phase only filters out a path when its own path has work.
            ordinary = [
                s for s in q.items if not s.prefilled and not s.protect_at < now <= s.deadline
            ]
            if view.phase is Phase.SHORT:
                assert any(not s.long_path for s in ordinary) or not any(
                    s.long_path for s in ordinary
                )
                # With late_yield, late short-path prefills alone do not hold the phase
                # against an on-time long-path one.
                on_time = [s for s in ordinary if not late_yield or now <= s.deadline]
                assert any(not s.long_path for s in on_time) or not any(
                    s.long_path for s in on_time
                )


def walk(view: StepView, items: list[RequestSignals]) -> list[RequestSignals]:
    """The queue walk, as before long-path phases read their members from the index."""
    if view.edf:
        return view.split(items, _ident)[0]
    out = [s for s in items if view.is_visible(s)]
    assert len(out) == view.visible
    if view.late:
        out.sort(key=lambda s: s.late)
    return out


queue_ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "take", "requeue", "step", "step"]),
        st.sampled_from(CLASSES),
        st.booleans(),  # decode continuation when adding or re-queueing
        # Time advance: steps apart, and jumps that protect requests or make them late.
        st.sampled_from([0.0, 0.001, 0.01, 0.02, 0.05, 0.2, 0.45, 0.6, 3.0]),
        st.integers(min_value=0, max_value=1000),  # which request to take or re-queue
    ),
    min_size=20,
    max_size=150,
)


@settings(max_examples=300, deadline=None)
def take_batch(q, view: StepView, batch: int) -> list[RequestSignals]:  # type: ignore[no-untyped-def]
    """Take up to `batch` visible requests the way the simulator does: each leaves the index as
    it is taken (while the view is being iterated), the queue after the iteration."""
    taken: list[RequestSignals] = []
    for sig in view.iter_visible(q.items, _ident, _ident):
        if len(taken) == batch:
            break
        taken.append(sig)
        q.sched.remove(sig)
    for sig in taken:
        q.items.remove(sig)
    return taken


@given(
    ops=queue_ops,
    cap=st.integers(min_value=0, max_value=4),
    keep_late=st.booleans(),
    batch=st.integers(min_value=0, max_value=4),
    late_yield=st.booleans(),
)
def test_long_phase_members_equal_the_walk(
    ops: list, cap: int, keep_late: bool, batch: int, late_yield: bool
) -> None:
    """Long-path phases: the index's members, looked up, are the walk's exact sequence on a
    queue in entry order (re-queued requests at the tail), also when the caller dequeues what
    it takes while it iterates."""
    control = ControlParams(
        long_path_cap=cap,
        late=LateRule.PROTECT if keep_late else LateRule.YIELD_PHASE,
        rotation_n_min=1,
        rotation_n_max=2,
    )
    q = make_queue(control, late_yield=late_yield)
    now = 0.0
    for op, cls, prefilled, dt, pick in ops:
        now += dt
        if op == "add":
            q.add(cls, now, prefilled=prefilled)
        elif op in ("take", "requeue") and q.items:
            q.churn(op, pick, now, prefilled=prefilled)
        elif op == "step":
            view = q.sched.plan(now)
            expected = walk(view, q.items)
            assert list(view.iter_visible(q.items, _ident)) == expected  # the queue walk
            members = view.members()
            assert members == expected if view.phase is Phase.LONG else members is None
            assert list(view.iter_visible(q.items, _ident, _ident)) == expected
            assert take_batch(q, view, batch) == expected[:batch]


def test_long_phase_members_follow_protection() -> None:
    """Members gain a request when it becomes protected and lose it when it turns late."""
    q = make_queue(ControlParams(long_path_cap=2, rotation_n_min=1, rotation_n_max=1))
    text = q.add("text", 0.0)  # deadline 0.5 s, protected from ~0.46 s
    audio = q.add("audio-out", 0.0)
    image = q.add("image-out", 0.0)
    assert q.sched.plan(0.1).phase is Phase.SHORT
    view = q.sched.plan(0.2)
    assert view.members() == walk(view, q.items) == [audio, image]
    view = q.sched.plan(0.47)
    assert view.phase is Phase.LONG and text.protected
    assert view.members() == walk(view, q.items) == [text, audio, image]
    view = q.sched.plan(0.48)  # short turn, no ordinary short prefill: yields to long
    assert view.phase is Phase.LONG
    assert view.members() == walk(view, q.items) == [text, audio, image]
    view = q.sched.plan(0.52)
    assert view.phase is Phase.LONG and text.late
    assert view.members() == walk(view, q.items) == [audio, image]


def _no_lookup(sig: RequestSignals) -> RequestSignals:
    raise AssertionError("read the members")


def test_big_cap_long_phase_walks_the_queue() -> None:
    """A cap showing more long-path prefills than MEMBERS_LONG_MAX and a quarter of the queue
    leaves the view to the walk; the sequence is the same either way."""
    q = make_queue(ControlParams(long_path_cap=1024, rotation_n_min=1, rotation_n_max=1))
    longs = [q.add("image-out" if i % 2 else "audio-out", 0.0) for i in range(MEMBERS_LONG_MAX + 1)]
    q.add("text", 0.0)
    q.sched.plan(0.01)  # short phase
    view = q.sched.plan(0.02)
    assert view.phase is Phase.LONG
    assert view.members() == walk(view, q.items) == longs
    assert list(view.iter_visible(q.items, _ident, _no_lookup)) == longs


def test_long_phase_members_skip_hidden_requests() -> None:
    """With a lookup, a long-path phase never reads the queue: hidden requests are not seen."""
    q = make_queue(ControlParams(long_path_cap=2, rotation_n_min=1, rotation_n_max=1))
    shorts = [q.add("text", 0.0) for _ in range(50)]
    longs = [q.add("audio-out", 0.0) for _ in range(3)]
    cont = q.add("text", 0.0, prefilled=True)
    q.sched.plan(0.01)  # short phase
    view = q.sched.plan(0.02)
    assert view.phase is Phase.LONG

    def untouchable():  # type: ignore[no-untyped-def]
        raise AssertionError("walked the queue")
        yield

    assert list(view.iter_visible(untouchable(), _ident, _ident)) == [*longs[:2], cont]
    assert walk(view, q.items) == [*longs[:2], cont]
    assert shorts[0] not in view.members()  # type: ignore[operator]


@settings(max_examples=150, deadline=None)
@given(
    queue=st.lists(st.integers(min_value=0, max_value=1), min_size=0, max_size=40),
    taken=st.sets(st.integers(min_value=0, max_value=39)),
    added=st.integers(min_value=0, max_value=3),
)
def test_restore_is_exact(queue: list[int], taken: set[int], added: int) -> None:
    original = [object() for _ in queue]
    hidden = [o for o, h in zip(original, queue, strict=True) if h]
    visible = [o for o, h in zip(original, queue, strict=True) if not h]
    gone = {id(v) for i, v in enumerate(visible) if i in taken}
    new = [object() for _ in range(added)]  # e.g. requests the base scheduler preempted
    left_in_view = new + [v for v in visible if id(v) not in gone]
    result = restore(original, left_in_view, hidden)
    assert result == new + [o for o in original if id(o) not in gone]


@settings(max_examples=100, deadline=None)
@given(fracs=st.lists(st.floats(min_value=0, max_value=1), min_size=30, max_size=120))
def test_long_phases_get_their_share_in_every_window(fracs: list[float]) -> None:
    """Over any N_max + M consecutive steps at least M are long-path phases."""
    control = ControlParams()
    q = make_queue(control)
    # Keep both paths busy so phases are never redirected by work conservation.
    for _ in range(3):
        q.add("audio-out", 0.0)
    shorts = [q.add("text", 0.0) for _ in range(20)]
    phases = []
    now = 0.0
    for frac in fracs:
        # Steer the protected share by latching protection on a prefix of the short requests.
        for i, s in enumerate(shorts):
            s.protected = i < round(frac * len(shorts))
        q.sched._short_protected = sum(s.protected for s in shorts)
        phases.append(q.sched.plan(now).phase)
        now += 0.001
    window = control.rotation_n_max + control.rotation_m
    for i in range(len(phases) - window + 1):
        assert phases[i : i + window].count(Phase.LONG) >= control.rotation_m


@given(a=st.integers(0, 50), b=st.integers(0, 50), total=st.integers(1, 50))
def test_n_is_monotone_in_protected_fraction(a: int, b: int, total: int) -> None:
    control = ControlParams()
    lo, hi = sorted((min(a, total), min(b, total)))
    n_lo, n_hi = rotation_n(control, lo, total), rotation_n(control, hi, total)
    assert control.rotation_n_min <= n_lo <= n_hi <= control.rotation_n_max


def test_rotation_cycle_is_n_short_then_m_long() -> None:
    q = make_queue()
    q.add("text", 0.0)
    q.add("audio-out", 0.0)
    phases = [q.sched.plan(0.001 * k).phase for k in range(8)]
    # No short request is protected: N = N_min = 2, cycle = S S L L.
    assert phases == [Phase.SHORT, Phase.SHORT, Phase.LONG, Phase.LONG] * 2


def test_figure6_short_phase_hides_ordinary_long_prefills() -> None:
    """A long-path burst queued ahead of text: the short phase shows text, protected, decode."""
    q = make_queue()
    burst = [q.add("audio-out", 0.0) for _ in range(4)]
    urgent = q.add("image-out", -19.9)  # arrived long ago: little slack left, protected
    decoding = q.add("audio-out", 0.0, prefilled=True)
    text = [q.add("text", 0.01) for _ in range(2)]
    view = q.sched.plan(0.02)
    assert view.phase is Phase.SHORT
    visible, hidden = view.split(q.items, _ident)
    assert visible == [urgent, decoding, *text]
    assert hidden == burst
    # The base scheduler takes the text requests; restore puts the burst back, order intact.
    left = [v for v in visible if v not in text]
    assert restore(q.items, left, hidden) == [*burst, urgent, decoding]


def test_long_phase_admits_earliest_deadlines_up_to_cap() -> None:
    q = make_queue(ControlParams(long_path_cap=2, rotation_n_min=1, rotation_n_max=1))
    late = q.add("image-out", 0.0)  # deadline 20 s
    early = [q.add("audio-out", 0.0) for _ in range(3)]  # deadline 5 s
    q.add("text", 0.0)
    q.sched.plan(0.01)  # short phase
    view = q.sched.plan(0.02)
    assert view.phase is Phase.LONG
    visible, _ = view.split(q.items, _ident)
    assert visible == early[:2]
    assert late not in visible


def test_no_rotation_shows_everything_and_edf_sorts() -> None:
    q = make_queue(rotation=False, edf=True)
    img = q.add("image-out", 0.0)
    txt = q.add("text", 0.0)
    aud = q.add("audio-out", 0.0)
    view = q.sched.plan(0.0)
    assert view.phase is Phase.ALL
    assert view.split(q.items, _ident) == ([txt, aud, img], [])
    assert list(view.iter_visible(q.items, _ident)) == [txt, aud, img]


def test_adding_twice_is_refused() -> None:
    q = make_queue()
    sig = q.add("text", 0.0)
    with pytest.raises(ValueError, match="already waiting"):
        q.sched.add(sig, 0.0)


@pytest.mark.parametrize(
    ("late_yield", "late_phase_yield", "phase"),
    [(True, True, Phase.LONG), (True, False, Phase.SHORT), (False, True, Phase.SHORT)],
)
def test_late_text_does_not_hold_a_short_phase_against_on_time_speech(
    late_yield: bool, late_phase_yield: bool, phase: Phase
) -> None:
    """Past capacity the text left waiting is late: with late_yield and late_phase_yield a
    short-path phase that has only late text yields to an on-time long-path prefill; without
    either the text holds it."""
    control = ControlParams(
        rotation_n_min=4, rotation_n_max=4, late="yield-phase" if late_phase_yield else "yield"
    )
    q = make_queue(control, late_yield=late_yield)
    text = q.add("text", 0.0)  # deadline 0.5 s
    speech = q.add("audio-out", 1.0)  # deadline 6 s
    view = q.sched.plan(1.0)  # the cycle's first step: a short-path phase by rotation
    assert text.late  # past its deadline either way
    assert view.phase is phase
    assert view.is_visible(speech) == (phase is Phase.LONG)
    # On-time text keeps the short-path phase either way.
    fresh = q.add("text", 1.0)
    assert q.sched.plan(1.001).phase is Phase.SHORT and fresh.waiting


def test_protection_ends_at_the_deadline() -> None:
    """A request that already missed its deadline competes as an ordinary one again."""
    q = make_queue(ControlParams(rotation_n_max=2))
    text = q.add("text", 0.0)  # deadline 0.5 s
    q.add("audio-out", 0.0)
    assert q.sched.plan(0.49).is_visible(text) and text.protected
    q.sched.plan(0.495)  # short phase 2 of 2
    view = q.sched.plan(0.6)  # long phase, text is late now
    assert view.phase is Phase.LONG
    assert text.late and not text.protected
    assert not view.is_visible(text)


def test_protect_past_deadline_keeps_late_requests_visible() -> None:
    q = make_queue(ControlParams(late="protect", rotation_n_max=2))
    text = q.add("text", 0.0)
    q.add("audio-out", 0.0)
    views = [q.sched.plan(t) for t in (0.49, 0.495, 0.6)]
    assert views[-1].phase is Phase.LONG
    assert views[-1].is_visible(text) and not text.late


# -- deadline order (`view_order` 'deadline') ---------------------------------------------------


def _slo_with_loose_short():
    """make_slo plus a short-path class with a looser SLO than text (a summary)."""
    slo = make_slo()
    text = slo.classes[0]
    summary = text.model_copy(update={"name": "summary", "solo_p95_s": 0.4})
    return slo.model_copy(update={"classes": [*slo.classes, summary]})


def make_dl_queue(control: ControlParams, late_yield: bool) -> Queue:
    sched = scheduler(control, late_yield=late_yield, deadline_order=True)
    return Queue(sched, RequestProfiler(_slo_with_loose_short(), control.u_guard), [])


def dl_oracle(
    view: StepView,
    items: list[RequestSignals],
    now: float,
    cap: int,
    keep_late: bool,
    late_yield: bool,
) -> list:
    """The deadline-ordered view from the definitions: what the FIFO view shows, plus the
    on-time short-path prefills in a long-path phase; on-time ones by deadline, then (with
    late prefills deferred, `view.late`) the late ones in queue order."""
    protected = {
        id(s)
        for s in items
        if not s.prefilled and s.protect_at < now and (keep_late or now <= s.deadline)
    }
    deferred = late_yield and not keep_late

    def late(s: RequestSignals) -> bool:
        return not keep_late and not s.prefilled and now > s.deadline

    # The long-path cap: earliest deadlines, on-time ones first while late ones are deferred.
    ordinary_long = sorted(
        (s for s in items if s.long_path and not s.prefilled and id(s) not in protected),
        key=lambda s: (late(s) and deferred, s.deadline, s.seq),
    )
    capped = {id(s) for s in ordinary_long[:cap]}

    def visible(s: RequestSignals) -> bool:
        if s.prefilled or id(s) in protected or view.phase is Phase.ALL:
            return True
        if not s.long_path:
            return view.phase is Phase.SHORT or not late(s)
        return view.phase is Phase.LONG and id(s) in capped

    shown = [s for s in items if visible(s)]
    if deferred:
        on = sorted((s for s in shown if not late(s)), key=lambda s: (s.deadline, s.seq))
        return on + [s for s in shown if late(s)]
    return sorted(shown, key=lambda s: (s.deadline, s.seq))


@settings(max_examples=300, deadline=None)
@given(
    ops=queue_ops,
    cap=st.integers(min_value=0, max_value=4),
    keep_late=st.booleans(),
    batch=st.integers(min_value=0, max_value=4),
    late_yield=st.booleans(),
    rotation_off=st.booleans(),
    lazy=st.booleans(),
)
def test_deadline_order_view(
    ops: list,
    cap: int,
    keep_late: bool,
    batch: int,
    late_yield: bool,
    rotation_off: bool,
    lazy: bool,
) -> None:
    """Deadline order: the index's sequence (lookup), the queue walk and the split agree with
    the definitions, also when the caller dequeues what it takes while it iterates. `lazy`:
    the index merges its deadline-sorted lists at every size (MERGE_MIN 0) instead of sorting
    the short ones."""
    with mock.patch.object(temporal, "MERGE_MIN", 0 if lazy else temporal.MERGE_MIN):
        _check_deadline_order_view(ops, cap, keep_late, batch, late_yield, rotation_off)


def _check_deadline_order_view(
    ops: list, cap: int, keep_late: bool, batch: int, late_yield: bool, rotation_off: bool
) -> None:
    control = ControlParams(
        long_path_cap=cap,
        late=LateRule.PROTECT if keep_late else LateRule.YIELD_PHASE,
        rotation_n_min=1,
        rotation_n_max=2,
    )
    q = make_dl_queue(control, late_yield)
    if rotation_off:
        q.sched = scheduler(control, rotation=False, late_yield=late_yield, deadline_order=True)
    classes = (*CLASSES, "summary")
    now = 0.0
    for op, cls, prefilled, dt, pick in ops:
        now += dt
        if op == "add":
            q.add(classes[pick % 4] if cls == "text" else cls, now, prefilled=prefilled)
        elif op in ("take", "requeue") and q.items:
            q.churn(op, pick, now, prefilled=prefilled)
        elif op == "step":
            view = q.sched.plan(now)
            assert view.edf
            expected = dl_oracle(view, q.items, now, cap, keep_late, late_yield)
            assert view.split(q.items, _ident)[0] == expected
            assert view.visible == len(expected)
            assert list(view.iter_visible(q.items, _ident)) == expected  # the queue walk
            assert list(view.iter_visible(q.items, _ident, _ident)) == expected
            if view.phase is Phase.LONG:
                assert view.members() == expected
            assert take_batch(q, view, batch) == expected[:batch]


def test_deadline_order_puts_tight_text_before_a_loose_prompt_that_came_first() -> None:
    """A summary (loose SLO) that arrived first goes behind a text prompt due sooner; in a
    long-path phase the on-time text prompt stays visible, ahead of the capped long-path
    prefill with the later deadline."""
    q = make_dl_queue(ControlParams(rotation_n_min=1, rotation_n_max=1, rotation_m=1), True)
    summary = q.add("summary", 0.0)
    text = q.add("text", 0.01)
    speech = q.add("audio-out", 0.0)
    view = q.sched.plan(0.02)
    assert view.phase is Phase.SHORT
    assert list(view.iter_visible(q.items, _ident, _ident)) == [text, summary]
    assert list(view.iter_visible(q.items, _ident)) == [text, summary]
    view = q.sched.plan(0.02)
    assert view.phase is Phase.LONG
    assert list(view.iter_visible(q.items, _ident, _ident)) == [text, summary, speech]
    assert view.members() == [text, summary, speech]


def test_deadline_order_keeps_a_requeued_late_request_in_its_deadline_place() -> None:
    """All waiting prompts late, no late yield: they join one deadline order. A request
    re-queued at the tail of the entry order keeps its place by (deadline, seq) there too."""
    q = make_dl_queue(ControlParams(rotation_n_min=1, rotation_n_max=2), False)
    first, *rest = [q.add("text", 0.0) for _ in range(3)]
    q.requeue(first, 0.6, prefilled=False)
    view = q.sched.plan(0.6)
    assert view.phase is Phase.SHORT and first.late
    assert list(view.iter_visible(q.items, _ident, _ident)) == [first, *rest]
    assert list(view.iter_visible(q.items, _ident)) == [first, *rest]


def test_priority_order_is_refused_with_rotation_or_late_yielding_naming_both_fields() -> None:
    with pytest.raises(ValueError, match="view_order 'priority' with rotation 'path'"):
        ControlParams(view_order="priority")
    with pytest.raises(ValueError, match="view_order 'priority' with late 'yield-phase'"):
        ControlParams(view_order="priority", rotation="off")
    ControlParams(view_order="priority", rotation="off", late="compete")  # a plain queue order
