"""The simulator's cost model reproduces the engine: CUDA-graph batch padding where the engine
pads, the decode slope per SM level, limits from the deploy description."""

from __future__ import annotations

import pytest

from horizonserve.runtime.artifact import SmCurve, load_artifact
from horizonserve.runtime.calibrate import derive
from horizonserve.runtime.engine.deploy import graph_batch_sizes, load_deploy
from horizonserve.runtime.sim.limits import with_deploy
from horizonserve.runtime.sim.model import SharedCost, Sharing

PIPE = "qwen2_5_omni"


def _cal(profile: str, **shared: object):  # type: ignore[no-untyped-def]
    cal = with_deploy(load_artifact().pipeline(PIPE), load_deploy(PIPE, profile))
    return cal.model_copy(update={"shared": cal.shared.model_copy(update=shared)})


def test_graph_batch_sizes_are_the_engines() -> None:
    ar = pytest.importorskip("horizonserve.runtime.engine.reference.ar")  # needs torch
    for n in (1, 4, 16, 48, 100):
        assert graph_batch_sizes(n) == ar.batch_buckets(n)


def test_decode_pads_to_the_captured_batch_only_with_graphs() -> None:
    tuned, stock = SharedCost(_cal("tuned")), SharedCost(_cal("stock"))
    assert [tuned.decode_rows(n) for n in (1, 3, 5, 17, 33, 48)] == [1, 4, 8, 32, 48, 48]
    assert [stock.decode_rows(n) for n in (1, 3, 5, 16)] == [1, 3, 5, 16]  # enforce_eager
    # With a per-sequence cost, 5 sequences cost what the padded 8 rows cost.
    cost = SharedCost(_cal("tuned", decode_seq_frac=0.02))
    args = (0, 0, False, Sharing.PARTITION, False)
    assert cost.iteration_s(80, 5, *args) == pytest.approx(cost.iteration_s(80, 8, *args))
    assert cost.iteration_s(80, 9, *args) > cost.iteration_s(80, 8, *args)


def test_decode_slope_follows_the_sm_level() -> None:
    flat = SharedCost(_cal("tuned", decode_seq_frac=0.02, decode_slope_scale=None))
    k = SmCurve(sms=[32, 132], values=[2.0, 1.0])
    steep = SharedCost(_cal("tuned", decode_seq_frac=0.02, decode_slope_scale=k))
    args = (0, 4096, False, Sharing.PARTITION, False)
    base = flat.decode_step_s(32)
    extra_flat = flat.iteration_s(32, 8, *args) - base
    extra_steep = steep.iteration_s(32, 8, *args) - base
    assert extra_steep == pytest.approx(2 * extra_flat)
    assert steep.iteration_s(132, 8, *args) == pytest.approx(flat.iteration_s(132, 8, *args))


def test_slope_scale_recovers_a_known_curve() -> None:
    seq, ctx, c8, c1 = 0.01, 2e-5, 512, 128
    k = {32: 1.8, 64: 1.2, 132: 1.0}
    d1 = {32: 9e-3, 64: 7e-3, 132: 6e-3}
    b8 = {s: d1[s] * (1 + k[s] * (seq * 7 + ctx * 8 * c8)) for s in k}
    b1 = {s: d1[s] * (1 + k[s] * ctx * c1) for s in k}
    got = derive.slope_scale(b8, b1, seq, ctx, c8, c1, 132)
    assert got == pytest.approx(k)
