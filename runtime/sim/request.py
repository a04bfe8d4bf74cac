"""Per-run state of one simulated request (the ground truth the policy never sees)."""

from __future__ import annotations

from horizonserve.runtime.profiler import RequestSignals

NOT_YET = -1.0  # timestamp not reached


class SimRequest:
    """One request's work and progress. Times are simulated seconds."""

    __slots__ = (
        "arrival",
        "audio_out_s",
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
        "sig",
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
        self.prompt = prompt  # prompt tokens to prefill
        self.decode_len = decode_len  # shared-stage tokens to produce (incl. the first)
        self.handoff_at = handoff_at  # tokens produced before the downstream hand-off
        self.long_path = long_path
        self.audio_out_s = audio_out_s
        self.images = images
        self.kv_need = prompt + decode_len  # reserved at admission; no preemption modelled
        self.prefilled = 0
        self.decoded = 0
        self.handed = False
        self.first_token = NOT_YET
        self.last_token = NOT_YET
        self.first_response = NOT_YET
        self.sig: RequestSignals | None = None


def sig_of(req: SimRequest) -> RequestSignals:
    return req.sig  # type: ignore[return-value]
