"""Request model of the reference server's `POST /v1/requests` and its error shape.

Every number is finite and bounded, every string has a maximum length, unknown fields are
refused; a refusal names the field (`ApiError.field`) and how to fix it. Bounds that depend on
the running model (tokens per KV slot, denoising steps) come from `ApiLimits.for_preset`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from horizonserve.runtime.engine.reference.pipeline import MAX_RID_CHARS
from horizonserve.runtime.engine.reference.presets import PipelinePreset

MAX_BODY_BYTES = 64 * 1024
MAX_SECONDS = 3600.0  # audio / video input and client timeouts
DEFAULT_TIMEOUT_S = 300.0
ID_PATTERN = r"^[A-Za-z0-9._:\-]+$"
MAX_CLASS_CHARS = 64


class ApiError(Exception):
    """A refused request: HTTP status, the field at fault and a message saying the fix."""

    def __init__(
        self,
        status: int,
        field: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        reason: str = "invalid",
        counted: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message
        self.headers = headers or {}
        self.reason = reason  # the rejection counter's label
        self.counted = counted  # the pipeline counted this refusal already

    def body(self) -> dict[str, Any]:
        return {"error": f"{self.field}: {self.message}", "field": self.field}


@dataclass(frozen=True, slots=True)
class ApiLimits:
    """Upper bounds of the request fields (inclusive)."""

    max_tokens: int = 4096  # input_tokens / output_tokens: the thinker's tokens per KV slot
    max_speech_codes: int = 4096  # downstream_tokens of a speech request
    max_image_steps: int = 200  # downstream_tokens of an image request
    max_images: int = 16
    max_seconds: float = MAX_SECONDS
    # Prompt tokens of the media (the shared stage's `prompt_len`): prompt + output tokens
    # must fit one KV slot (`max_tokens`), or the stage would trim the prompt.
    tokens_per_audio_second: int = 25
    tokens_per_video_second: int = 128
    tokens_per_image: int = 256

    @classmethod
    def for_preset(cls, preset: PipelinePreset) -> ApiLimits:
        return cls(
            max_tokens=preset.thinker_limits.max_len,
            max_speech_codes=preset.talker_limits.max_len,
            max_image_steps=max(100, 4 * preset.dit.steps),
            tokens_per_audio_second=preset.tokens_per_audio_second,
            tokens_per_video_second=preset.tokens_per_video_second,
            tokens_per_image=preset.tokens_per_image,
        )

    def prompt_tokens(self, req: GenerateRequest) -> int:
        """The request's shared-stage prompt length (text + audio + video + images)."""
        n = req.input_tokens + round(req.audio_seconds * self.tokens_per_audio_second)
        n += round(req.video_seconds * self.tokens_per_video_second)
        return max(1, n + req.images * self.tokens_per_image)

    def downstream_bound(self, downstream: str | None) -> tuple[int, str]:
        """The downstream_tokens bound of a class whose long path is `downstream`."""
        if downstream == "image":
            return self.max_image_steps, "denoising steps"
        return self.max_speech_codes, "speech codes"


Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False, strict=True)]


class GenerateRequest(BaseModel):
    """Body of POST /v1/requests (lengths as a workload trace gives them)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: Annotated[str | None, Field(min_length=1, max_length=MAX_RID_CHARS, pattern=ID_PATTERN)] = (
        None
    )
    priority: Annotated[StrictInt | None, Field(ge=0, le=1000)] = None
    class_: Annotated[
        str | None, Field(alias="class", min_length=1, max_length=MAX_CLASS_CHARS)
    ] = None
    input_tokens: Annotated[StrictInt, Field(ge=0)] = 64
    audio_seconds: Seconds = 0.0
    video_seconds: Seconds = 0.0
    images: Annotated[StrictInt, Field(ge=0)] = 0
    output_tokens: Annotated[StrictInt, Field(ge=1)] = 16
    downstream_tokens: Annotated[StrictInt | None, Field(ge=1)] = None
    timeout_s: Annotated[float, Field(gt=0.0, le=MAX_SECONDS, allow_inf_nan=False, strict=True)] = (
        DEFAULT_TIMEOUT_S
    )
    stream: StrictBool = False

    def check_limits(self, limits: ApiLimits) -> None:
        """Model-dependent bounds; ApiError names the field."""
        for name in ("input_tokens", "output_tokens"):
            value = getattr(self, name)
            if value > limits.max_tokens:
                raise ApiError(400, name, f"at most {limits.max_tokens} (tokens per KV slot)")
        if self.images > limits.max_images:
            raise ApiError(400, "images", f"at most {limits.max_images}")
        if self.downstream_tokens is not None:
            top = max(limits.max_speech_codes, limits.max_image_steps)
            if self.downstream_tokens > top:
                raise ApiError(400, "downstream_tokens", f"at most {top}")
        prompt = limits.prompt_tokens(self)
        if prompt + self.output_tokens > limits.max_tokens:
            raise ApiError(
                400,
                "input_tokens",
                f"the prompt ({prompt} tokens with its audio, video and images) plus "
                f"output_tokens ({self.output_tokens}) exceeds the {limits.max_tokens} tokens "
                "of a KV slot; send a shorter input or ask fewer output tokens",
            )
        if self.priority is None and self.class_ is None:
            raise ApiError(
                400, "priority", "give 'priority' (0 text, 10 audio, 20 image) or 'class'"
            )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ApiError(400, str(key)[:64], "given twice in the JSON object")
        out[key] = value
    return out


class _NonFinite:
    """What NaN / Infinity / -Infinity parse to: the field they stand in is named later."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body; ApiError (field "body" or the duplicated key)."""
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, "body", f"larger than {MAX_BODY_BYTES} bytes", reason="too_large")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "body", "not UTF-8") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_NonFinite)
    except ApiError:
        raise
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "body", f"not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(doc, dict):
        raise ApiError(400, "body", "must be a JSON object")
    for key, value in doc.items():  # NaN, Infinity, 1e400 (parses as inf): name the field
        if isinstance(value, _NonFinite) or (isinstance(value, float) and not math.isfinite(value)):
            raise ApiError(400, str(key)[:64], "must be a finite number")
    return doc


def validate_request(doc: dict[str, Any], limits: ApiLimits) -> GenerateRequest:
    """A GenerateRequest from a parsed body; ApiError names the first bad field."""
    try:
        req = GenerateRequest.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err.get("loc", ())) or "body"
        raise ApiError(400, loc[:64], str(err.get("msg", "invalid"))) from None
    req.check_limits(limits)
    return req
