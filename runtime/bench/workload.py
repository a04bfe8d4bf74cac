"""Workloads: per-class input/output length distributions (shipped data) and Poisson traces.

Data files: `runtime/data/workloads/<pipeline>.json` (a `WorkloadSpec`) and
`runtime/data/workloads/datasets.json` (the published statistics the distributions are built
from, with references). Nothing is downloaded at run time.

Traces use common random numbers: the class of request i is chosen by comparing one uniform
draw u_i with the mix's cumulative weights, each class's features are drawn from that class's own
stream in order of appearance, and arrival times are unit-rate exponential gaps divided by the
rate. So two traces with the same seed differ only where the rate or the mix forces them to.
"""

from __future__ import annotations

import math
from typing import Literal, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from horizonserve.runtime.sim.trace import Trace


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LengthDist(_Model):
    """A non-negative quantity: lognormal by arithmetic mean and sd, or constant / uniform.

    Samples are clipped to [low, high]; `integer` rounds them.
    """

    kind: Literal["lognormal", "constant", "uniform"] = "lognormal"
    mean: float = Field(ge=0)
    sd: float = Field(0.0, ge=0)
    low: float = Field(0.0, ge=0)
    high: float | None = Field(None, gt=0)
    integer: bool = True

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.kind == "lognormal" and (self.mean <= 0 or self.sd <= 0):
            raise ValueError("a lognormal needs mean > 0 and sd > 0")
        if self.kind == "uniform" and (self.high is None or self.high < self.low):
            raise ValueError("a uniform needs high ≥ low")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "constant":
            x = np.full(n, self.mean)
        elif self.kind == "uniform":
            x = rng.uniform(self.low, self.high, n)
        else:
            var = math.log1p((self.sd / self.mean) ** 2)
            mu = math.log(self.mean) - var / 2
            x = rng.lognormal(mu, math.sqrt(var), n)
        x = np.clip(x, self.low, self.high if self.high is not None else np.inf)
        return np.rint(x).astype(np.int64) if self.integer else x


class ClassWorkload(_Model):
    """What one request class sends and how long its answer is."""

    name: str = Field(min_length=1)
    weight: float = Field(gt=0, description="Share in the default mix (normalised).")
    text_tokens: LengthDist | None = None
    audio_s: LengthDist | None = None
    images: int = Field(0, ge=0)
    video_s: LengthDist | None = None
    output_tokens: LengthDist = Field(description="Answer tokens (text, or text to be spoken).")
    datasets: list[str] = Field(default_factory=list, description="Keys into datasets.json.")
    note: str = ""


class SweepDefaults(_Model):
    """The bench's default sweep points for this pipeline (req/s, long-path shares)."""

    rates: list[float] = Field(min_length=1)
    long_ratios: list[float] = Field(min_length=1)
    long_sweep_rate: float = Field(gt=0, description="Fixed offered load of the long-path sweep.")
    trace_rate: float = Field(gt=0, description="Rate of the control-trace run (Figure 10).")
    trace_long_ratio: float = Field(0.4, ge=0, le=1)


class WorkloadSpec(_Model):
    pipeline: str = Field(min_length=1)
    description: str = ""
    speech_seconds_per_token: float = Field(
        gt=0, description="Spoken seconds per answer token (speaking rate)."
    )
    classes: list[ClassWorkload] = Field(min_length=1)
    sweep: SweepDefaults
    provenance: str = Field(min_length=1)

    def get(self, name: str) -> ClassWorkload:
        for c in self.classes:
            if c.name == name:
                return c
        raise ValueError(f"workload {self.pipeline!r} has no class {name!r}")


class DatasetCard(_Model):
    name: str
    reference: str
    url: str | None = None
    statistics: dict[str, float | str]
    used_for: str


class DatasetRegistry(_Model):
    note: str
    datasets: dict[str, DatasetCard]


def _read(rel: str) -> str:
    from importlib import resources

    return resources.files("horizonserve.runtime").joinpath(f"data/workloads/{rel}").read_text()


def load_workload(pipeline: str) -> WorkloadSpec:
    spec = WorkloadSpec.model_validate_json(_read(f"{pipeline}.json"))
    known = load_datasets().datasets
    for c in spec.classes:
        missing = [d for d in c.datasets if d not in known]
        if missing:
            raise ValueError(f"workload {pipeline}: class {c.name!r} cites unknown {missing}")
    return spec


def load_datasets() -> DatasetRegistry:
    return DatasetRegistry.model_validate_json(_read("datasets.json"))


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
def generate(
    spec: WorkloadSpec,
    mix: dict[str, float],
    *,
    rate: float,
    duration_s: float | None = None,
    n_requests: int | None = None,
    warmup_s: float = 0.0,
    seed: int = 0,
) -> Trace:
    """A Poisson trace at `rate` req/s over `duration_s` (or exactly `n_requests` requests)."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if (duration_s is None) == (n_requests is None):
        raise ValueError("give exactly one of duration_s and n_requests")
    names = tuple(c.name for c in spec.classes)
    root = np.random.SeedSequence(seed)
    s_arr, s_cls, *s_feat = root.spawn(2 + len(names))
    if n_requests is None:
        assert duration_s is not None
        # Enough unit-rate gaps to cover the window with overwhelming probability.
        expect = rate * duration_s
        n_draw = int(expect + 8 * math.sqrt(expect + 1) + 16)
        gaps = np.random.default_rng(s_arr).exponential(1.0, n_draw)
        arrival = np.cumsum(gaps) / rate
        arrival = arrival[arrival < duration_s]
        n = len(arrival)
    else:
        n = n_requests
        gaps = np.random.default_rng(s_arr).exponential(1.0, n)
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
