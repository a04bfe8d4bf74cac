"""Workload specs: per-class input/output length distributions, read from shipped data.

Data files: `runtime/data/workloads/<pipeline>.json` (a `WorkloadSpec`) and
`runtime/data/workloads/datasets.json` (the published statistics the distributions are built
from, with references). Nothing is downloaded at run time.
"""

from __future__ import annotations

import math
from importlib import resources
from typing import Literal, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


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
