"""Per-run state of one simulated request (the ground truth the policy never sees)."""

from __future__ import annotations

from horizonserve.runtime.downstream import Stamp
from horizonserve.runtime.profiler import RequestSignals

NOT_YET = -1.0  # timestamp not reached


class SimRequest:
    """One request's work and progress. Times are simulated seconds."""

    __slots__ = (
        "arrival",
        "audio_out_s",
        "base_prompt",
        "cls",
        "decode_len",
        "decoded",
        "first_response",
        "first_token",
        "handed",
        "handoff_at",
        "idx",
        "images",
        "kv_need",
        "last_token",
        "long_path",
        "prefilled",
        "prompt",
        "restart",
        "sig",
        "stamp",
    )

    def __init__(
        self,
        idx: int,
        cls: int,
        arrival: float,
        prompt: int,
        decode_len: int,
        handoff_at: int,
        long_path: bool,
        audio_out_s: float,
        images: int,
    ) -> None:
        self.idx = idx
        self.cls = cls
        self.arrival = arrival
        self.prompt = prompt  # tokens to prefill (the prompt, plus decoded ones on a restart)
        self.base_prompt = prompt
        self.decode_len = decode_len  # shared-stage tokens to produce (incl. the first)
        self.handoff_at = handoff_at  # tokens produced before the downstream hand-off
        self.long_path = long_path
        self.audio_out_s = audio_out_s
        self.images = images
        self.kv_need = prompt + decode_len  # reserved at admission, freed by a preemption
        self.prefilled = 0
        self.decoded = 0
        self.handed = False
        self.first_token = NOT_YET
        self.last_token = NOT_YET
        self.first_response = NOT_YET
        self.sig: RequestSignals | None = None
        self.stamp: Stamp | None = None  # set at the hand-off, travels downstream
        self.restart = False  # re-prefilling after a preemption (recompute, as vLLM does)

    def preempt(self) -> None:
        """Back to waiting as a decode continuation: the KV is gone, so the prompt and the
        tokens decoded so far are prefilled again before decoding resumes."""
        self.prompt = self.base_prompt + self.decoded
        self.prefilled = 0
        self.restart = True


def sync_sig(req: SimRequest) -> RequestSignals:
    """The request's signals with its progress (the engines record it as it happens; the
    simulator brings it up to date only where a decision reads it)."""
    sig = req.sig
    assert sig is not None
    prefilled = req.prefilled >= req.prompt and not req.restart
    if sig.prefilled != prefilled or sig.decoded_tokens != req.decoded:
        sig.prefilled = prefilled
        sig.decoded_tokens = req.decoded
        sig.protect_at = sig.deadline - sig.guard * sig.remaining_s()
    return sig


def sig_of(req: SimRequest) -> RequestSignals:
    return req.sig  # type: ignore[return-value]
