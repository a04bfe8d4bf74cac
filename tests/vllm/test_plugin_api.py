"""Priority / deadline plumbing from the API into every stage, and first-response statistics.

The OpenAI chat layer cannot be imported on the CPU test install (it needs torchaudio), and a
real `AsyncOmni` needs running stages, so the API objects here are stand-ins with the real
signatures (pinned against vLLM-Omni's own below), wrapped by the plugin's real wrappers. From
the stamped per-stage parameters on, everything is real: the thinker's request is a vLLM
`Request`, the talker's is built by vLLM-Omni's orchestrator helper
(`build_engine_core_request_from_tokens`, fresh arrival time, no priority) and converted the
way the engine core does, and both go through the real stage schedulers with HorizonServe.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from factory import import_pipeline_registry
from horizon import ids

pytestmark = pytest.mark.vllm


# -- stand-ins with vLLM-Omni's signatures -----------------------------------------------------


class StubEngine:
    """`AsyncOmniEngine` as `AsyncOmni.generate` sees it (Qwen2.5-Omni's three stages)."""

    def __init__(self) -> None:
        from vllm.sampling_params import SamplingParams

        self.stage_metadata = [
            SimpleNamespace(final_output_type="text"),
            SimpleNamespace(final_output_type="latent"),
            SimpleNamespace(final_output_type="audio"),
        ]
        self.default_sampling_params_list = [SamplingParams(max_tokens=8) for _ in range(3)]
        self.calls: list[dict[str, Any]] = []

    def add_request(
        self,
        request_id,
        prompt,
        prompt_text=None,
        sampling_params_list=None,
        final_stage_id=0,
        final_output_stage_ids=None,
        arrival_time=None,
        lora_request=None,
        tokenization_kwargs=None,
        trace_headers=None,
        priority=0,
        data_parallel_rank=None,
        reasoning_ended=None,
        *,
        resumable=False,
    ) -> None:
        self.calls.append(
            {
                "request_id": request_id,
                "sampling_params_list": sampling_params_list,
                "priority": priority,
                "arrival_time": arrival_time,
            }
        )

    async def add_request_async(self, **kwargs: Any) -> None:
        self.add_request(**kwargs)


class StubOmni:
    """`AsyncOmni.generate`: unique id, engine.add_request_async, then the stage outputs."""

    def __init__(self, engine: StubEngine, outputs: list[Any]) -> None:
        self.engine = engine
        self.outputs = outputs

    async def generate(
        self,
        prompt,
        sampling_params=None,
        request_id="",
        *,
        sampling_params_list=None,
        output_modalities=None,
        priority=0,
        arrival_time=None,
        **kwargs,
    ):
        rid = f"{request_id}-abcd1234"  # AsyncOmni._get_unique_request_id
        final_ids = [0, 2] if output_modalities is None or "audio" in output_modalities else [0]
        await self.engine.add_request_async(
            request_id=rid,
            prompt=prompt,
            sampling_params_list=sampling_params_list,
            final_stage_id=max(final_ids),
            final_output_stage_ids=final_ids,
            arrival_time=arrival_time if arrival_time is not None else time.time(),
        )
        for out in self.outputs:
            yield out


class StubChat:
    """`OmniOpenAIServingChat.create_chat_completion`: calls generate without priority."""

    def __init__(self, engine_client: StubOmni) -> None:
        self.engine_client = engine_client

    async def create_chat_completion(self, request, raw_request=None):
        generator = self.engine_client.generate(
            prompt={"prompt": "hi"},
            request_id="chatcmpl-1",
            sampling_params_list=None,
            output_modalities=["text", "audio"],
            arrival_time=time.time(),
        )
        return [out async for out in generator]


@pytest.fixture
def api(hs_env, tmp_path, monkeypatch):
    """ApiState with a private metrics registry; stub classes wrapped by the plugin."""
    from prometheus_client import CollectorRegistry

    from horizonserve.runtime.engine.vllm_omni import api as hs_api
    from horizonserve.runtime.engine.vllm_omni import shared
    from horizonserve.runtime.engine.vllm_omni.settings import resolve_config
    from horizonserve.runtime.metrics import MetricsRecorder

    state = hs_api.ApiState(
        resolve_config(),
        table=shared.request_table(),
        recorder=MetricsRecorder(CollectorRegistry()),
        stats_file=tmp_path / "node-stats.json",
    )
    hs_api.set_api_state(state)
    for cls, name in (
        (StubEngine, "add_request"),
        (StubOmni, "generate"),
        (StubChat, "create_chat_completion"),
    ):
        monkeypatch.setattr(cls, name, getattr(cls, name))  # restored after the test
    assert hs_api.install_add_request(StubEngine)
    assert hs_api.install_generate(StubOmni)
    assert hs_api.install_chat(StubChat)
    assert not hs_api.install_generate(StubOmni)  # idempotent
    return state


def _outputs(rid_prefix: str) -> list[Any]:
    from vllm_omni.outputs import OmniRequestOutput

    text = OmniRequestOutput(request_id=rid_prefix, final_output_type="text", finished=False)
    text.outputs = [SimpleNamespace(token_ids=[11], text="Hi")]
    audio = OmniRequestOutput(request_id=rid_prefix, final_output_type="audio", finished=False)
    return [text, audio]


def _chat_request(**fields: Any) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], model="m", **fields)


def test_priority_from_the_api_reaches_thinker_talker_and_code2wav(api, make_scheduler):
    """A chat request with priority 10 (OpenAI client: extra_body={"priority": 10})."""
    from vllm.v1.request import Request
    from vllm_omni.engine.orchestrator import build_engine_core_request_from_tokens

    from horizonserve.runtime.engine.vllm_omni import shared
    from horizonserve.runtime.engine.vllm_omni.scheduler import (
        ar_scheduler,
        generation_scheduler,
    )
    from horizonserve.runtime.engine.vllm_omni.stamps import stamp_of_params

    engine = StubEngine()
    chat = StubChat(StubOmni(engine, _outputs("chatcmpl-1")))
    asyncio.run(chat.create_chat_completion(_chat_request(priority=10)))

    (call,) = engine.calls
    rid = call["request_id"]
    assert call["priority"] == 10  # passed on to stage 0 now
    stamps = [stamp_of_params(p) for p in call["sampling_params_list"]]
    assert all(s is not None and s == stamps[0] for s in stamps)  # every stage, one stamp
    stamp = stamps[0]
    assert (stamp.rid, stamp.priority, stamp.class_name) == (rid, 10, "speech")
    assert stamp.deadline_ns - stamp.arrival_ns == round(api.slo.target_s("speech") * 1e9)
    assert engine.default_sampling_params_list[0].extra_args is None  # defaults untouched
    entry = shared.request_table().lookup(rid)
    assert entry is None  # generate finished: its table entry is gone again

    # Stage 0 (thinker): the engine's request, id suffixed by vLLM, external id = ours.
    thinker = make_scheduler("omni_ar_async", scheduler_cls=ar_scheduler)
    request = Request(
        request_id=f"{rid}-0a1b2c3d",
        prompt_token_ids=[5] * 8,
        sampling_params=call["sampling_params_list"][0],
        pooling_params=None,
        arrival_time=call["arrival_time"],
        priority=call["priority"],
    )
    request.external_req_id = rid
    thinker.add_request(request)
    sig = request._hs_sig
    assert sig.cls.name == "speech" and sig.long_path
    assert sig.deadline == pytest.approx(stamp.deadline_s, abs=1e-6)
    assert sig.arrival == pytest.approx(stamp.arrival_s, abs=1e-6)

    # Stage 1 (talker): built like the orchestrator does, fresh arrival time, no priority.
    talker = make_scheduler(
        "omni_ar_async", scheduler_cls=ar_scheduler, stage_id=1, model_stage="talker"
    )
    core = build_engine_core_request_from_tokens(
        request_id=rid, prompt={"prompt_token_ids": [7] * 6}, params=call["sampling_params_list"][1]
    )
    core.external_req_id = core.request_id
    talker_request = Request.from_engine_core_request(core, None)
    assert talker_request.priority == 0 and talker_request.arrival_time > call["arrival_time"]
    talker.add_request(talker_request)
    assert talker.hs_stamp(rid) == stamp  # same class, same original deadline
    assert talker_request._hs_stamp.deadline_ns == stamp.deadline_ns

    # Stage 2 (code2wav, a generation stage).
    code2wav = make_scheduler(
        "omni_ar", scheduler_cls=generation_scheduler, stage_id=2, model_stage="code2wav"
    )
    core = build_engine_core_request_from_tokens(
        request_id=rid, prompt={"prompt_token_ids": [9] * 4}, params=call["sampling_params_list"][2]
    )
    code2wav.add_request(Request.from_engine_core_request(core, None))
    assert code2wav.hs_stamp(rid) == stamp


def test_first_response_is_recorded_per_class_and_reaches_the_stats_file(api):
    from horizonserve.runtime.node_stats import read_stats

    engine = StubEngine()
    chat = StubChat(StubOmni(engine, _outputs("chatcmpl-1")))
    outs = asyncio.run(chat.create_chat_completion(_chat_request(priority=10)))
    assert [o.final_output_type for o in outs] == ["text", "audio"]
    # speech is judged by its first audio chunk (TTFO), not by the first text token
    ((rid, name, latency),) = api.first_responses
    assert rid == engine.calls[0]["request_id"] and name == "speech"
    assert 0 <= latency < 5
    api.write_stats_once()
    classes, _, _ = read_stats(api.stats_file)
    by_name = {c.name: c for c in classes}
    assert by_name["speech"].requests == 1 and by_name["speech"].met == 1
    assert by_name["text"].requests == 0


@pytest.mark.parametrize(
    ("fields", "headers", "modalities", "expected"),
    [
        ({}, {}, ["text", "audio"], ("speech", 10)),  # default by output modality
        ({}, {}, ["text"], ("text", 0)),
        ({"priority": 0}, {}, ["text", "audio"], ("text", 0)),  # explicit body field
        ({}, {"X-Vllm-Priority": "10"}, ["text"], ("speech", 10)),  # header
    ],
)
def test_class_from_priority_or_modality(api, fields, headers, modalities, expected):
    from horizonserve.runtime.engine.vllm_omni.stamps import stamp_of_params

    engine = StubEngine()
    omni = StubOmni(engine, [])

    class Chat(StubChat):
        async def create_chat_completion(self, request, raw_request=None):
            gen = self.engine_client.generate(
                prompt="hi", request_id="r", output_modalities=modalities
            )
            return [o async for o in gen]

    from horizonserve.runtime.engine.vllm_omni.api import wrap_chat

    Chat.create_chat_completion = wrap_chat(Chat.create_chat_completion)
    raw = SimpleNamespace(headers=headers)
    asyncio.run(Chat(omni).create_chat_completion(_chat_request(**fields), raw))
    stamp = stamp_of_params(engine.calls[0]["sampling_params_list"][0])
    assert (stamp.class_name, stamp.priority) == expected


@pytest.mark.parametrize(
    ("fields", "headers", "modalities", "field"),
    [
        ({"priority": 5}, {}, ["text"], "priority"),  # not a configured code
        ({}, {"X-Vllm-Priority": "\uff12\uff10"}, ["text"], "X-Vllm-Priority"),  # "２０"
        ({}, {"X-Vllm-Priority": " 20 "}, ["text"], "X-Vllm-Priority"),
        ({}, {"X-Vllm-Priority": "1_0"}, ["text"], "X-Vllm-Priority"),
        ({}, {"X-Vllm-Priority": "7"}, ["text"], "priority"),
        ({}, {}, ["smell"], "modalities"),
        ({}, {}, ["image"], "modalities"),  # no image class in this pipeline
    ],
)
def test_unknown_priority_or_modality_is_a_400(api, fields, headers, modalities, field):
    from horizonserve.runtime.engine.vllm_omni.api import ApiRequestError, wrap_chat

    engine = StubEngine()
    omni = StubOmni(engine, [])
    answers: list[tuple[str, int, str]] = []

    class Chat(StubChat):
        def create_error_response(self, message, status_code=400, param=None):
            answers.append((message, int(status_code), param))
            return "error-response"

        async def create_chat_completion(self, request, raw_request=None):
            gen = self.engine_client.generate(
                prompt="hi", request_id="r", output_modalities=modalities
            )
            return [o async for o in gen]

    Chat.create_chat_completion = wrap_chat(Chat.create_chat_completion)
    raw = SimpleNamespace(headers=headers)
    out = asyncio.run(Chat(omni).create_chat_completion(_chat_request(**fields), raw))
    assert out == "error-response" and not engine.calls  # nothing reached the engine
    assert len(answers) == 1
    message, status, param = answers[0]
    assert status == 400 and param == field and message.startswith(f"{field}: ")
    with pytest.raises(ApiRequestError):  # without vLLM's error helper the error surfaces
        bare = StubChat(omni)
        bare.create_chat_completion = wrap_chat(Chat.create_chat_completion.__wrapped__)
        asyncio.run(bare.create_chat_completion(bare, _chat_request(**fields), raw))


def test_request_ids_that_are_not_utf8_are_stamped(api):
    from horizonserve.runtime.engine.vllm_omni.stamps import stamp_of_params

    engine = StubEngine()
    omni = StubOmni(engine, [])
    rid = b"req-\xff\xfe".decode("utf-8", "surrogateescape")

    async def run() -> None:
        async for _ in omni.generate("hi", request_id=rid, priority=10):
            pass

    asyncio.run(run())
    assert stamp_of_params(engine.calls[0]["sampling_params_list"][0]).class_name == "speech"


def test_generate_priority_argument_and_engine_defaults(api):
    """Direct AsyncOmni.generate callers (speech / image endpoints, scripts)."""
    from horizonserve.runtime.engine.vllm_omni.stamps import stamp_of_params

    engine = StubEngine()
    omni = StubOmni(engine, [])

    async def run() -> None:
        async for _ in omni.generate("hi", request_id="a", priority=10):
            pass
        async for _ in omni.generate("hi", request_id="b", output_modalities=["text"]):
            pass

    asyncio.run(run())
    first, second = (stamp_of_params(c["sampling_params_list"][2]) for c in engine.calls)
    assert first.class_name == "speech"
    assert second.class_name == "text"


def test_table_backs_stages_without_extra_args(hs_env, make_scheduler, clock):
    """A stage whose parameters lost the stamp finds class and deadline by request id."""
    from factory import make_request

    from horizonserve.runtime.engine.vllm_omni import shared
    from horizonserve.runtime.engine.vllm_omni.scheduler import ar_scheduler
    from horizonserve.runtime.engine.vllm_omni.settings import resolve_config
    from horizonserve.runtime.engine.vllm_omni.stamps import make_stamp

    config = resolve_config()
    stamp = make_stamp(config.slo, "req-7", 10, clock.now_ns - 2_000_000_000)
    shared.request_table().insert("req-7", stamp.priority, stamp.arrival_ns, stamp.deadline_ns)
    thinker = make_scheduler("omni_ar", scheduler_cls=ar_scheduler)
    thinker.horizon.clock_ns = clock
    thinker.add_request(make_request("req-7", 8))  # no extra_args
    sig = thinker.requests["req-7"]._hs_sig
    assert sig.cls.name == "speech"
    assert sig.deadline == pytest.approx(stamp.deadline_s, abs=1e-6)
    talker = make_scheduler("omni_ar", scheduler_cls=ar_scheduler, stage_id=1)
    talker.add_request(make_request("req-7", 4))
    got = talker.hs_stamp("req-7")
    assert (got.priority, got.deadline_ns) == (10, stamp.deadline_ns)
    assert ids(talker.waiting) == ["req-7"]


def test_wrappers_install_on_the_real_classes(hs_env, monkeypatch):
    import_pipeline_registry()
    from vllm_omni.engine.async_omni_engine import AsyncOmniEngine
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    from horizonserve.runtime.engine.vllm_omni import api as hs_api

    monkeypatch.setattr(AsyncOmni, "generate", AsyncOmni.generate)
    monkeypatch.setattr(AsyncOmniEngine, "add_request", AsyncOmniEngine.add_request)
    real_generate = inspect.signature(AsyncOmni.generate).parameters
    for name in ("priority", "output_modalities", "arrival_time", "sampling_params_list"):
        assert real_generate[name].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(AsyncOmniEngine.add_request).parameters) == list(
        inspect.signature(StubEngine.add_request).parameters
    )
    assert hs_api.install_generate(AsyncOmni) and hs_api.install_add_request(AsyncOmniEngine)
    assert getattr(AsyncOmni.generate, hs_api.WRAPPED)
    assert not hs_api.install_add_request(AsyncOmniEngine)


def test_chat_endpoint_source_matches_the_wrapper():
    """serving_chat needs torchaudio to import; pin its shape from the source instead."""
    # find_spec would import vllm_omni.entrypoints.openai (the API server: uvicorn, ...).
    root = Path(importlib.util.find_spec("vllm_omni").submodule_search_locations[0])
    source = root / "entrypoints" / "openai" / "serving_chat.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "OmniOpenAIServingChat"
    )
    methods = {n.name: n for n in cls.body if isinstance(n, ast.AsyncFunctionDef)}
    entry = methods["create_chat_completion"]
    assert [a.arg for a in entry.args.args] == ["self", "request", "raw_request"]

    def generate_calls(node: ast.AST) -> list[ast.Call]:
        return [
            n
            for n in ast.walk(node)
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.engine_client.generate"
        ]

    # The endpoint awaits `_create_chat_completion`, which calls generate without priority:
    # the wrapper's context variable (set around the endpoint) is visible at that call.
    assert "self._create_chat_completion" in ast.unparse(entry)
    calls = generate_calls(methods["_create_chat_completion"])
    assert calls and all("priority" not in {k.arg for k in c.keywords} for c in calls)


def test_explicit_priority():
    from horizonserve.runtime.engine.vllm_omni.api import explicit_priority

    assert explicit_priority(_chat_request()) is None
    assert explicit_priority(_chat_request(priority=0)) == 0
    assert explicit_priority(_chat_request(priority=20)) == 20
    raw = SimpleNamespace(headers={"X-Vllm-Priority": "10"})
    assert explicit_priority(_chat_request(priority=0), raw) == 10
    assert explicit_priority(_chat_request(), SimpleNamespace(headers={})) is None
