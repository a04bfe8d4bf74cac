"""Arrival traces and class mixes drawn from a workload spec.

Traces use common random numbers: the class of request i is chosen by comparing one uniform
draw u_i with the mix's cumulative weights, each class's features are drawn from that class's own
stream in order of appearance, and arrival times are unit-mean gaps divided by the rate. So two
traces with the same seed differ only where the rate or the mix forces them to.

Gaps are exponential (Poisson arrivals) by default. `burstiness` b ≠ 1 draws them from a gamma
distribution of shape b and mean 1, as vLLM's serving benchmark does (`--burstiness`): the
coefficient of variation of the gaps is 1/√b, so b < 1 sends bursts separated by lulls at the
same mean rate.
"""

from __future__ import annotations

import math

import numpy as np

from horizonserve.runtime.workload.spec import WorkloadSpec
from horizonserve.runtime.workload.trace import Trace


# -- mixes ---------------------------------------------------------------------------------------
def mix_weights(
    spec: WorkloadSpec,
    long_classes: tuple[str, ...],
    long_ratio: float | None = None,
    override: dict[str, float] | None = None,
) -> dict[str, float]:
    """Normalised class shares: the default mix, an explicit override, or a long-path share.

    With `long_ratio` r, long-path classes share r in proportion to their base weights and
    short-path classes share 1 − r (the paper's long-path sweep at fixed offered load).
    """
    base = {c.name: c.weight for c in spec.classes}
    if override:
        unknown = sorted(set(override) - set(base))
        if unknown:
            raise ValueError(f"mix: unknown classes {unknown}; known: {sorted(base)}")
        base = {k: float(override.get(k, 0.0)) for k in base}
    if long_ratio is not None:
        if not 0.0 <= long_ratio <= 1.0:
            raise ValueError(f"long-path ratio must be in [0, 1], got {long_ratio}")
        long_w = sum(w for k, w in base.items() if k in long_classes)
        short_w = sum(w for k, w in base.items() if k not in long_classes)
        out = {}
        for k, w in base.items():
            if k in long_classes:
                out[k] = long_ratio * w / long_w if long_w else 0.0
            else:
                out[k] = (1 - long_ratio) * w / short_w if short_w else 0.0
        base = out
    total = sum(base.values())
    if total <= 0:
        raise ValueError("mix: all class weights are zero")
    return {k: w / total for k, w in base.items()}


# -- traces ---------------------------------------------------------------------------------------
def _unit_gaps(seed: np.random.SeedSequence, n: int, burstiness: float) -> np.ndarray:
    """`n` inter-arrival gaps of mean 1: exponential at burstiness 1 (the draws every earlier
    trace used), else gamma of shape `burstiness`."""
    rng = np.random.default_rng(seed)
    if burstiness == 1.0:
        return rng.exponential(1.0, n)
    return rng.gamma(burstiness, 1.0 / burstiness, n)


def generate(
    spec: WorkloadSpec,
    mix: dict[str, float],
    *,
    rate: float,
    duration_s: float | None = None,
    n_requests: int | None = None,
    warmup_s: float = 0.0,
    seed: int = 0,
    burstiness: float = 1.0,
) -> Trace:
    """A trace at `rate` req/s over `duration_s` (or exactly `n_requests` requests); Poisson
    unless `burstiness` ≠ 1 (module docstring)."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(
            f"burstiness must be a positive number (1: Poisson, below 1: burstier), "
            f"got {burstiness}"
        )
    if (duration_s is None) == (n_requests is None):
        raise ValueError("give exactly one of duration_s and n_requests")
    names = tuple(c.name for c in spec.classes)
    root = np.random.SeedSequence(seed)
    s_arr, s_cls, *s_feat = root.spawn(2 + len(names))
    if n_requests is None:
        assert duration_s is not None
        # Enough unit-mean gaps to cover the window with overwhelming probability (their
        # count's spread grows with the gaps' variance, 1/b).
        expect = rate * duration_s
        n_draw = int(expect + 8 * math.sqrt((expect + 1) / min(1.0, burstiness)) + 16)
        gaps = _unit_gaps(s_arr, n_draw, burstiness)
        arrival = np.cumsum(gaps) / rate
        arrival = arrival[arrival < duration_s]
        n = len(arrival)
    else:
        n = n_requests
        gaps = _unit_gaps(s_arr, n, burstiness)
        arrival = np.cumsum(gaps) / rate
        duration_s = float(arrival[-1]) + 1e-9 if n else 0.0
    u = np.random.default_rng(s_cls).random(n)
    cum = np.cumsum([mix.get(name, 0.0) for name in names])
    cum /= cum[-1]
    cls = np.minimum(np.searchsorted(cum, u, side="right"), len(names) - 1)
    cols = {
        k: np.zeros(n, dtype=np.int64 if k in ("text_tokens", "images", "output_tokens") else float)
        for k in ("text_tokens", "audio_s", "images", "video_s", "output_tokens", "output_audio_s")
    }
    for ci, (name, ss) in enumerate(zip(names, s_feat, strict=True)):
        idx = np.nonzero(cls == ci)[0]
        m = len(idx)
        if not m:
            continue
        c = spec.get(name)
        rng = np.random.default_rng(ss)
        # Fixed draw order per class keeps each class's stream independent of the others.
        text = c.text_tokens.sample(rng, m) if c.text_tokens else np.zeros(m, np.int64)
        audio = c.audio_s.sample(rng, m) if c.audio_s else np.zeros(m)
        video = c.video_s.sample(rng, m) if c.video_s else np.zeros(m)
        out = c.output_tokens.sample(rng, m)
        cols["text_tokens"][idx] = text
        cols["audio_s"][idx] = audio
        cols["video_s"][idx] = video
        cols["images"][idx] = c.images
        cols["output_tokens"][idx] = out
        cols["output_audio_s"][idx] = out * spec.speech_seconds_per_token
    return Trace(
        classes=names,
        cls=cls.astype(np.int64),
        arrival=arrival,
        rate=rate,
        duration_s=float(duration_s),
        warmup_s=warmup_s,
        **cols,
    )
