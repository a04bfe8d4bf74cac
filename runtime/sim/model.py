"""Stage-latency, contention and memory-pressure model, read from a calibration artifact.

Each function is one documented formula over the artifact's curves (see
`horizonserve.runtime.artifact` for the definitions). Curve lookups are memoised per
SM count because a run only ever visits a handful of SM levels.

GPU sharing between the shared stage and the downstream stages, while both are busy:
  partition  HorizonServe's Green-Context split (a ladder level or the reservation): shared
             stage on s SMs, downstream on S_tot − s; each pays the co-run factor the artifact
             measured at that split, and nothing of the MPS excess (disjoint SMs).
  timeslice  no SM control, no MPS (vanilla vLLM-Omni): both stages on the whole GPU.
  mps        no SM control, NVIDIA MPS: both on the whole GPU; the shared stage pays
             `mps_shared_excess` of the time-sliced excess, its decode more per row beyond the
             8 rows that was measured with (`SharingCalibration.mps_decode_factor`).

A prefill call costs `prefill_call_s` plus `prefill_token_s` per (padded) token; co-running
slows both alike.

Urgent-prefill boost (`boosted_iteration_s`): an iteration whose prefill carries an urgent
prompt runs that prefill on S_aggr SMs, beyond its partition and over the downstream's SMs, then
its decode at the cap. HorizonServe's stage processes are MPS clients under the Green Contexts,
so on the overlapped SMs the kernels of both run at the same time, as under MPS: the prefill pays
`boost_prefill_excess` of the MPS co-run excess (it keeps its own partition's SMs; measured
from the BAGEL campaign's steps: about a quarter), the downstream keeps its S_tot − cap SMs and
pays its MPS factor.
A backlog-lifted iteration (level LIFTED) is the same overlap for the whole iteration:
`iteration_s` at S_aggr with `Sharing.MPS`, the downstream on S_tot − S_cap with its MPS factor.
"""

from __future__ import annotations

from enum import StrEnum

from horizonserve.runtime.artifact import (
    DownstreamStageCalibration,
    PipelineCalibration,
    SmCurve,
)


class Sharing(StrEnum):
    PARTITION = "partition"
    TIMESLICE = "timeslice"
    MPS = "mps"


class _Memo:
    """SmCurve.at memoised by SM count."""

    __slots__ = ("_cache", "_curve")

    def __init__(self, curve: SmCurve) -> None:
        self._curve = curve
        self._cache: dict[int, float] = {}

    def __call__(self, sms: int) -> float:
        v = self._cache.get(sms)
        if v is None:
            v = self._curve.at(sms)
            self._cache[sms] = v
        return v


class SharedCost:
    """Iteration time of the shared stage."""

    __slots__ = (
        "_boost",
        "_call",
        "_cd",
        "_cp",
        "_ctx",
        "_dec",
        "_mps",
        "_mps_decode",
        "_pre",
        "_rows",
        "_rows_frac",
        "_seq",
        "_slope",
        "_switch",
        "total_sms",
    )

    def __init__(self, cal: PipelineCalibration) -> None:
        s = cal.shared
        self.total_sms = cal.ladder.total
        self._dec = _Memo(s.decode_step_s)
        self._pre = _Memo(s.prefill_token_s)
        self._cd = _Memo(s.corun_decode_factor)
        self._cp = _Memo(s.corun_prefill_factor)
        self._seq = s.decode_seq_frac
        self._ctx = s.decode_ctx_frac
        self._switch = s.sm_switch_s
        self._call = s.prefill_call_s
        self._mps = cal.sharing.mps_shared_factor
        self._boost = cal.sharing.boost_prefill_factor
        self._mps_decode = cal.sharing.mps_decode_factor
        self._rows_frac = cal.sharing.mps_decode_rows_frac
        slope = s.decode_slope_scale
        self._slope = _Memo(slope) if slope is not None else (lambda _sms: 1.0)
        # Rows a decode step runs: the smallest captured graph batch that holds the sequences
        # (the engine pads to it), or exactly the sequences when it runs eagerly.
        sizes = s.graph_batch_sizes
        self._rows = [0] * (s.max_num_seqs + 1)
        for n in range(s.max_num_seqs + 1):
            self._rows[n] = next((b for b in sizes if b >= n), n) if sizes else n

    def decode_rows(self, seqs: int) -> int:
        return self._rows[seqs] if seqs < len(self._rows) else seqs

    def _mem(self, sms: int, seqs: int, cached_tokens: int) -> float:
        """decode_step(s)·(1 + k(s)·(seq·(rows−1) + ctx·cached)): the memory-bound term; no
        decode step without sequences (an iteration that only prefills, `prefill_then_decode`)."""
        if seqs <= 0:
            return 0.0
        extra = self._seq * (self.decode_rows(seqs) - 1) + self._ctx * cached_tokens
        return self._dec(sms) * (1.0 + self._slope(sms) * extra)

    def corun_factors(self, sms: int, sharing: Sharing) -> tuple[float, float]:
        """(decode, prefill) slowdown while a downstream stage co-runs."""
        if sharing is Sharing.PARTITION:
            return self._cd(sms), self._cp(sms)
        full = self.total_sms
        fd, fp = self._cd(full), self._cp(full)
        if sharing is Sharing.MPS:
            return self._mps(fd), self._mps(fp)
        return fd, fp

    def _prefill(self, sms: int, tokens: int) -> float:
        """One prefill call alone: prefill_call_s + prefill_token(s)·tokens (none: 0)."""
        return self._call + self._pre(sms) * tokens if tokens > 0 else 0.0

    def iteration_parts(
        self,
        sms: int,
        seqs: int,
        prefill_tokens: int,
        cached_tokens: int,
        corun: bool,
        sharing: Sharing,
    ) -> tuple[float, float]:
        """(prefill part, decode part) of an iteration at one SM count: the prefill call
        (`_prefill`)·fp and the decode term (`_mem`)·fd."""
        mem = self._mem(sms, seqs, cached_tokens)
        comp = self._prefill(sms, prefill_tokens)
        if corun:
            fd, fp = self.corun_factors(sms, sharing)
            if sharing is Sharing.MPS and self._rows_frac:
                fd = self._mps_decode(self._cd(self.total_sms), self.decode_rows(seqs))
            mem *= fd
            comp *= fp
        return comp, mem

    def iteration_s(
        self,
        sms: int,
        seqs: int,
        prefill_tokens: int,
        cached_tokens: int,
        corun: bool,
        sharing: Sharing,
        switched: bool,
    ) -> float:
        """Both parts of `iteration_parts`, plus a Green Context switch when `switched`."""
        comp, mem = self.iteration_parts(sms, seqs, prefill_tokens, cached_tokens, corun, sharing)
        return mem + comp + (self._switch if switched else 0.0)

    def boosted_iteration_s(
        self, sms: int, prefill_sms: int, seqs: int, prefill_tokens: int, cached_tokens: int
    ) -> tuple[float, float]:
        """(prefill part, decode part) of a co-running iteration whose prefill runs on
        `prefill_sms` > `sms` SMs (module docstring): the prefill at `prefill_sms` with the
        boost's share of the MPS factor, the decode term at the cap `sms` with the partition
        factor; each part opens with a Green Context switch (up to `prefill_sms`, back down to
        the cap)."""
        mem = self._mem(sms, seqs, cached_tokens)
        comp = self._prefill(prefill_sms, prefill_tokens)
        fp = self._boost(self._cp(self.total_sms))
        return self._switch + comp * fp, self._switch + mem * self._cd(sms)

    @property
    def switch_s(self) -> float:
        return self._switch

    def decode_step_s(self, sms: int) -> float:
        return self._dec(sms)

    def prefill_token_s(self, sms: int) -> float:
        return self._pre(sms)


class DownstreamCost:
    """Step time of one downstream stage."""

    __slots__ = ("_corun", "_frac", "_mps", "_step", "_ts", "cal")

    def __init__(self, cal: DownstreamStageCalibration, pipeline: PipelineCalibration) -> None:
        self.cal = cal
        self._step = _Memo(cal.step_s)
        self._corun = _Memo(cal.corun_factor)
        self._frac = cal.batch_frac
        self._ts = pipeline.sharing.timeslice_downstream_factor
        self._mps = pipeline.sharing.mps_downstream_factor

    def step_s(
        self, jobs: int, sms: int, shared_busy: bool, shared_sms: int, sharing: Sharing
    ) -> float:
        """step(s_down)·(1 + batch_frac·(jobs−1)) × co-run factor while the shared stage runs."""
        t = self._step(sms) * (1.0 + self._frac * (jobs - 1))
        if shared_busy:
            if sharing is Sharing.PARTITION:
                t *= self._corun(shared_sms)
            elif sharing is Sharing.MPS:
                t *= self._mps
            else:
                t *= self._ts
        return t

    def work(self, audio_s: float, images: int) -> float:
        """Steps a request brings to this stage."""
        c = self.cal
        w = c.work_fixed + c.work_per_audio_second * audio_s + c.work_per_input_image * images
        return w if w > 1e-3 else 1e-3


class PressureModel:
    """Noise-free NVML memory-activity fraction for the current activity."""

    __slots__ = ("_corun", "_down", "_idle", "_shared", "total_sms")

    def __init__(self, cal: PipelineCalibration) -> None:
        p = cal.pressure
        self._idle = p.idle
        self._shared = p.shared_only
        self._down = p.downstream_only
        self._corun = _Memo(p.corun)
        self.total_sms = cal.ladder.total

    def level(
        self, shared_busy: bool, shared_sms: int, occupancy: float, sharing: Sharing
    ) -> float:
        o = 1.0 if occupancy > 1.0 else occupancy
        if not shared_busy:
            return self._idle + (self._down - self._idle) * o
        if o <= 0.0:
            return self._shared
        sms = shared_sms if sharing is Sharing.PARTITION else self.total_sms
        return self._shared + (self._corun(sms) - self._shared) * o
