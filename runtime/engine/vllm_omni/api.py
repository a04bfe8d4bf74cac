"""Priority and deadline plumbing at the API layer, and first-response statistics.

vLLM-Omni drops the request priority twice on the way in (the OpenAI chat endpoint does not
pass it to `generate`, and `AsyncOmni.generate` does not pass it to the engine) and builds every
downstream stage's request with a fresh arrival time. Three wrappers fix that:

* `OmniOpenAIServingChat.create_chat_completion`: reads the request's priority (header
  `X-Vllm-Priority`, else the body's `priority` field when the client set it, e.g. through the
  OpenAI client's `extra_body`) into a context variable for the `generate` call it makes;
* `AsyncOmni.generate`: takes that priority (or its own `priority=` argument), the requested
  output modalities and the arrival time at call time, and observes the outputs it yields:
  the first text token / audio chunk / image is the request's first response, recorded per
  class (Prometheus metrics, the node sidecar's stats file);
* `AsyncOmniEngine.add_request` (the one place that sees the orchestrator's request id and the
  final per-stage parameter list): derives the class (explicit priority if it is a configured
  code, else by output modality: text 0, audio 10, image 20), stamps class, original arrival
  and deadline into every stage's `SamplingParams.extra_args`, passes the priority on to stage
  0, and records the request in the shared request table (for stages without `extra_args`).

Parsing is strict: a priority header must be plain ASCII digits ("20", "-5"; not "２０",
" 20 " or "1_0"), an explicit priority must be a configured class code, and output modalities
must be known ones; anything else is an `ApiRequestError` (HTTP 400 from the chat endpoint,
naming the field) instead of a silent default class. Request ids of any str (also ones with
surrogates from non-UTF-8 bytes) are accepted by the request table.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from horizonserve.runtime.config import Metric, ServingConfig
from horizonserve.runtime.engine.vllm_omni import shared
from horizonserve.runtime.engine.vllm_omni.settings import Knobs, resolve_config
from horizonserve.runtime.engine.vllm_omni.stamps import (
    Stamp,
    known_priority,
    make_stamp,
    monotonic_from_wall,
    priority_for_modalities,
    with_stamp,
)
from horizonserve.runtime.metrics import MetricsRecorder
from horizonserve.runtime.monitor import RequestTable, TableBusyError, TableFullError
from horizonserve.runtime.node_stats import class_summaries, stats_path, write_stats

log = logging.getLogger(__name__)

PRIORITY_HEADER = "X-Vllm-Priority"
WRAPPED = "__horizonserve_wrapped__"
KNOWN_MODALITIES = frozenset({"text", "audio", "image"})
_PRIORITY_TEXT = re.compile(r"-?[0-9]{1,9}")  # ASCII only: re's [0-9] is not \d


class ApiRequestError(ValueError):
    """A request the API refuses (400): `field` names what to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def parse_priority(raw: str) -> int:
    """A priority header's value as an int; ApiRequestError unless plain ASCII digits."""
    if not isinstance(raw, str) or not _PRIORITY_TEXT.fullmatch(raw):
        raise ApiRequestError(
            PRIORITY_HEADER, f"{raw!r} is not an integer code (ASCII digits, e.g. 0, 10, 20)"
        )
    return int(raw)


def check_priority(slo: Any, priority: int | None) -> None:
    """ApiRequestError when an explicit priority is not a configured class code."""
    if priority is not None and not known_priority(slo, priority):
        codes = sorted(int(c.priority) for c in slo.classes)
        raise ApiRequestError("priority", f"unknown code {priority}; this server serves {codes}")


def check_modalities(modalities: Any) -> list[str] | None:
    """The requested output modalities; ApiRequestError for anything unknown."""
    if modalities is None:
        return None
    if isinstance(modalities, str) or not isinstance(modalities, list | tuple | set | frozenset):
        raise ApiRequestError("modalities", 'give a list such as ["text", "audio"]')
    mods = list(modalities)
    unknown = [m for m in mods if not isinstance(m, str) or m not in KNOWN_MODALITIES]
    if unknown:
        raise ApiRequestError(
            "modalities", f"unknown {unknown!r}; known: {sorted(KNOWN_MODALITIES)}"
        )
    return mods


@dataclass(slots=True)
class _Call:
    """One `generate` call: what the API knew, and what add_request stamped."""

    priority: int | None
    modalities: list[str] | None
    arrival_wall: float | None
    rid: str | None = None
    stamp: Stamp | None = None


# Set by the chat endpoint wrapper around its `generate` call; read when `generate` is called.
_API_PRIORITY: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "horizonserve_api_priority", default=None
)
# Set inside the generate wrapper's body; read by the engine's add_request (same context).
_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "horizonserve_call", default=None
)

_FIRST_OUTPUT_TYPE = {Metric.TTFT: "text", Metric.TTFO: "audio", Metric.E2E: "image"}


class ApiState:
    """Per-process API-side state: the config, the request table, metrics, the stats file."""

    def __init__(
        self,
        config: ServingConfig,
        *,
        table: RequestTable | None = None,
        recorder: MetricsRecorder | None = None,
        knobs: Knobs | None = None,
        stats_file: Any = None,
    ) -> None:
        self.config = config
        self.slo = config.slo
        self.table = table
        self.recorder = recorder
        self.knobs = knobs or Knobs()
        self.stats_file = stats_file
        self._metric = {c.name: c.metric for c in config.slo.classes}
        if recorder is not None:
            recorder.use_slo_buckets(config.slo.target_s(c.name) for c in config.slo.classes)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._table_full_logged = False
        self.first_responses: list[tuple[str, str, float]] = []  # (rid, class, latency) tests

    # -- stamping ------------------------------------------------------------------------------
    def stamp(
        self, rid: str, priority: int | None, modalities: Iterable[str] | None, arrival: Any
    ) -> Stamp:
        """Class, arrival and deadline of a request; ApiRequestError for an unknown priority
        code, unknown modalities, or modalities no configured class serves."""
        check_priority(self.slo, priority)
        if priority is None:
            mods = check_modalities(list(modalities) if modalities is not None else None)
            priority = priority_for_modalities(mods)
            if not known_priority(self.slo, priority):  # e.g. images asked of a speech model
                served = sorted(c.name for c in self.slo.classes)
                raise ApiRequestError(
                    "modalities", f"{mods!r}: no class of this server produces them ({served})"
                )
        arrival_ns = monotonic_from_wall(arrival)
        stamp = make_stamp(self.slo, rid, priority, arrival_ns)
        if self.recorder is not None:  # judged at its deadline if no first response by then
            with self._lock:
                self.recorder.expect(
                    stamp.rid,
                    stamp.class_name,
                    stamp.arrival_ns * 1e-9,
                    self.slo.target_s(stamp.class_name),
                )
            self._ensure_writer()
        if self.table is not None:
            try:
                self.table.insert(rid, stamp.priority, stamp.arrival_ns, stamp.deadline_ns)
            except (TableFullError, TableBusyError) as exc:
                if not self._table_full_logged:
                    self._table_full_logged = True
                    log.warning("HorizonServe: %s (stamps still travel in extra_args)", exc)
        return stamp

    def client_gone(self, rid: str, now_ns: int) -> None:
        """The client went away before its deadline: the request is not judged."""
        if self.recorder is not None:
            self.recorder.client_gone(rid, now_ns * 1e-9)

    def forget(self, rid: str) -> None:
        if self.table is not None:
            try:
                self.table.delete(rid)
            except TableBusyError as exc:  # a stuck writer elsewhere: the entry stays, no crash
                log.warning("HorizonServe: %s", exc)

    # -- first responses -----------------------------------------------------------------------
    def output_type_for(self, stamp: Stamp) -> str:
        return _FIRST_OUTPUT_TYPE[self._metric.get(stamp.class_name, Metric.TTFT)]

    def first_response(self, stamp: Stamp, now_ns: int) -> None:
        latency = (now_ns - stamp.arrival_ns) * 1e-9
        self.first_responses.append((stamp.rid, stamp.class_name, latency))
        if len(self.first_responses) > 1024:
            del self.first_responses[:512]
        if self.recorder is None:
            return
        with self._lock:
            self.recorder.first_response_at(
                now_ns * 1e-9,
                stamp.class_name,
                latency,
                self.slo.target_s(stamp.class_name),
                key=stamp.rid,
            )
        self._ensure_writer()

    def _ensure_writer(self) -> None:
        if self._thread is not None or self.stats_file is None:
            return
        self._thread = threading.Thread(
            target=self._write_loop, name="horizonserve-stats", daemon=True
        )
        self._thread.start()

    def write_stats_once(self) -> None:
        if self.recorder is None or self.stats_file is None:
            return
        now = time.monotonic()
        with self._lock:
            classes = class_summaries(self.recorder, self.slo, now)
            self._sm_gauges()
        try:
            write_stats(self.stats_file, classes, self.recorder.window.window_s, time.time())
        except OSError as exc:
            log.warning("HorizonServe: cannot write stats file %s: %s", self.stats_file, exc)

    def _sm_gauges(self) -> None:
        """Copy the shared stage's last SM decision into the gauges (scrapes see it)."""
        try:
            d = shared.control_record().read_decision()
        except Exception:  # no record (tests) or torn beyond retry: skip this refresh
            return
        if d.steps:
            self.recorder.step(  # type: ignore[union-attr]
                d.shared_sms,
                d.downstream_sms,
                None if d.pressure_smoothed != d.pressure_smoothed else d.pressure_smoothed,
                0,
            )

    def _write_loop(self) -> None:
        while True:
            self.write_stats_once()
            time.sleep(self.knobs.stats_interval_s)


_state: ApiState | None = None
_state_lock = threading.Lock()


def api_state() -> ApiState:
    """This process's ApiState (built on first use, from the environment)."""
    global _state
    with _state_lock:
        if _state is None:
            from prometheus_client import REGISTRY

            config = resolve_config()
            _state = ApiState(
                config,
                table=shared.request_table(),
                recorder=MetricsRecorder(registry=REGISTRY, model_name=config.model),
                knobs=Knobs.from_env(),
                stats_file=stats_path(),
            )
        return _state


def set_api_state(state: ApiState | None) -> None:
    """Replace this process's ApiState (tests)."""
    global _state
    with _state_lock:
        _state = state


# -- wrappers ------------------------------------------------------------------------------------


def explicit_priority(request: Any, raw_request: Any = None) -> int | None:
    """The priority a chat request asked for: header, else the body field if the client set it.

    Raises ApiRequestError for a header that is not plain ASCII digits or a body field that
    is not an integer.
    """
    headers = getattr(raw_request, "headers", None)
    if headers is not None:
        raw = headers.get(PRIORITY_HEADER)
        if raw is not None:
            return parse_priority(raw)
    fields_set = getattr(request, "model_fields_set", None) or ()
    if "priority" in fields_set:
        value = getattr(request, "priority", None)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiRequestError("priority", f"{value!r} is not an integer code")
        return value
    return None


def _bad_request(serving: Any, err: ApiRequestError) -> Any:
    """vLLM's 400 ErrorResponse when the serving object makes one, else the error itself."""
    make = getattr(serving, "create_error_response", None)
    if make is None:
        raise err
    try:
        return make(str(err), status_code=HTTPStatus.BAD_REQUEST, param=err.field)
    except TypeError:  # an older signature without `param`
        return make(str(err))


def wrap_chat(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `create_chat_completion(self, request, raw_request=None)`."""

    @functools.wraps(orig)
    async def create_chat_completion(
        self: Any, request: Any, raw_request: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        try:
            priority = explicit_priority(request, raw_request)
            check_priority(api_state().slo, priority)
            check_modalities(getattr(request, "modalities", None))
        except ApiRequestError as err:
            return _bad_request(self, err)
        token = _API_PRIORITY.set(priority)
        try:
            return await orig(self, request, raw_request, *args, **kwargs)
        except ApiRequestError as err:  # raised where the engine stamps the request
            return _bad_request(self, err)
        finally:
            _API_PRIORITY.reset(token)

    setattr(create_chat_completion, WRAPPED, True)
    return create_chat_completion


def wrap_generate(
    orig: Callable[..., Any], state: Callable[[], ApiState] = api_state
) -> Callable[..., Any]:
    """Wrap `AsyncOmni.generate` (an async generator function) with a plain function.

    The call-time part runs where the caller calls `generate` (inside the chat endpoint, so
    the endpoint's priority is visible); the returned async generator sets the call for the
    engine's add_request and watches for the first response.
    """

    @functools.wraps(orig)
    def generate(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        priority = kwargs.get("priority") or None  # 0 is vLLM's default: not a choice
        api_priority = _API_PRIORITY.get()
        if api_priority is not None:
            priority = api_priority
        call = _Call(priority, kwargs.get("output_modalities"), kwargs.get("arrival_time"))
        return _observe(orig(self, *args, **kwargs), call, state)

    setattr(generate, WRAPPED, True)
    return generate


async def _observe(gen: Any, call: _Call, state: Callable[[], ApiState]) -> AsyncIterator[Any]:
    _CALL.set(call)
    want: str | None = None
    try:
        async for out in gen:
            if call.stamp is not None and want != "":
                if want is None:
                    want = state().output_type_for(call.stamp)
                if _is_first_response(out, want):
                    want = ""  # seen
                    state().first_response(call.stamp, time.monotonic_ns())
            yield out
    except (GeneratorExit, asyncio.CancelledError):  # the client went away
        if call.stamp is not None and want != "":
            state().client_gone(call.stamp.rid, time.monotonic_ns())
        raise
    finally:
        _CALL.set(None)
        await gen.aclose()
        if call.rid is not None:
            state().forget(call.rid)


def _is_first_response(out: Any, output_type: str) -> bool:
    if getattr(out, "final_output_type", "text") != output_type:
        return False
    if output_type == "text":
        outputs = getattr(out, "outputs", None) or ()
        return any(getattr(o, "token_ids", None) or getattr(o, "text", None) for o in outputs)
    if output_type == "image":
        return bool(getattr(out, "images", None)) or bool(getattr(out, "finished", False))
    return True  # audio: the first audio output is the first chunk


def _output_modalities(engine: Any, final_stage_ids: Any, final_stage_id: int) -> list[str]:
    metadata = getattr(engine, "stage_metadata", None) or ()
    ids = list(final_stage_ids) if final_stage_ids else [final_stage_id]
    mods = []
    for sid in ids:
        if 0 <= sid < len(metadata):
            kind = getattr(metadata[sid], "final_output_type", None)
            if kind:
                mods.append(kind)
    return mods


def wrap_add_request(
    orig: Callable[..., Any], state: Callable[[], ApiState] = api_state
) -> Callable[..., Any]:
    """Wrap `AsyncOmniEngine.add_request(self, request_id, prompt, ..., priority=0, ...)`."""
    signature = inspect.signature(orig)

    @functools.wraps(orig)
    def add_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        rid = arguments["request_id"]
        call = _CALL.get()
        priority = call.priority if call is not None else None
        if priority is None:
            priority = arguments.get("priority") or None
        modalities = call.modalities if call is not None and call.modalities else None
        if modalities is None:
            modalities = _output_modalities(
                self, arguments.get("final_output_stage_ids"), arguments.get("final_stage_id", 0)
            )
        arrival = arguments.get("arrival_time")
        if arrival is None and call is not None:
            arrival = call.arrival_wall
        st = state()
        stamp = st.stamp(rid, priority, modalities, arrival)
        params = arguments.get("sampling_params_list")
        if params is None:
            params = list(getattr(self, "default_sampling_params_list", None) or ())
        arguments["sampling_params_list"] = [with_stamp(p, stamp) for p in params]
        arguments["priority"] = stamp.priority
        if call is not None:
            call.rid, call.stamp = rid, stamp
        try:
            return orig(*bound.args, **bound.kwargs)
        except BaseException:
            st.forget(rid)
            raise

    setattr(add_request, WRAPPED, True)
    return add_request


def _install(cls: Any, name: str, wrapper: Callable[[Callable[..., Any]], Any]) -> bool:
    current = getattr(cls, name)
    if getattr(current, WRAPPED, False):
        return False
    setattr(cls, name, wrapper(current))
    return True


def install_generate(cls: Any) -> bool:
    return _install(cls, "generate", wrap_generate)


def install_add_request(cls: Any) -> bool:
    return _install(cls, "add_request", wrap_add_request)


def install_chat(cls: Any) -> bool:
    return _install(cls, "create_chat_completion", wrap_chat)
