"""The probing half of `horizonserve calibrate --backend vllm-omni`: requests and streams.

One probe request per class (its input built here: text, a WAV tone, a PNG gradient), sent as a
streamed chat completion; `Server.stream` reads the SSE stream to its end and returns what the
artifact needs from it: the first-response latency (first event carrying the class's output),
the shared stage's inter-token latencies as the engine timed them (`metrics.stage_metrics`,
sent when asked with `return_stage_metrics`), the arrival time of every text delta at the
client (the fallback, when the server sends no stage metrics) and the answer length
(`usage.completion_tokens`, sent when asked with `stream_options.include_usage`).
Also `vllm serve MODEL --omni` started as a child (`StartedServer`). Nothing here imports
vLLM: it talks HTTP.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import itertools
import json
import math
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import time
import wave
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from horizonserve.runtime import config as cfg
from horizonserve.runtime.calibrate.derive import p95

OUTPUT = {cfg.Metric.TTFT: "text", cfg.Metric.TTFO: "audio", cfg.Metric.E2E: "image"}
# Output modalities a probe asks for, by metric (speech answers stream text and audio).
MODALITIES = {
    cfg.Metric.TTFT: ["text"],
    cfg.Metric.TTFO: ["text", "audio"],
    cfg.Metric.E2E: ["image"],
}
INPUTS = ("text", "audio", "image")  # input kinds a probe can build (class name prefix)
PROMPT = "Describe a quiet morning by the sea in a few sentences."
AUDIO_S = 2.0  # probe audio clip: a 440 Hz tone, 16 kHz mono
IMAGE_PX = 224  # probe image: a colour gradient, IMAGE_PX x IMAGE_PX
POLL_S = 2.0
# The stage whose timing the stream's `metrics.stage_metrics` reports under this key: stage 0,
# the shared stage (thinker / LLM) of every shipped pipeline.
SHARED = "0"


class VllmOmniCalibrationError(ValueError):
    """A refused or failed vLLM-Omni calibration: one message naming the option and the fix."""


@dataclass(frozen=True, slots=True)
class Probe:
    """One class's probe request: its input kind, requested outputs and the awaited one."""

    name: str
    metric: cfg.Metric
    input: str

    @property
    def output(self) -> str:
        return OUTPUT[self.metric]


def probes_for(slo: cfg.SloTable, names: str | None) -> tuple[list[Probe], list[str]]:
    """The probes for `--classes` (None: every class with a buildable input) and the classes
    left out (their input cannot be built here)."""
    known = {c.name: c for c in slo.classes}
    if names is None:
        wanted = list(known)
    else:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        if not wanted:
            raise VllmOmniCalibrationError("--classes: name at least one class")
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise VllmOmniCalibrationError(
                f"--classes: unknown class {unknown[0]!r}; this pipeline has {sorted(known)}"
            )
    probes, skipped = [], []
    for name in wanted:
        kind = name.split("-", 1)[0]
        if kind in INPUTS:
            probes.append(Probe(name, known[name].metric, kind))
        elif names is not None:
            raise VllmOmniCalibrationError(
                f"--classes: class {name!r} takes {kind!r} input, which the calibration cannot "
                f"build (it builds {', '.join(INPUTS)}); leave it out"
            )
        else:
            skipped.append(name)
    return probes, skipped


def _wav(seconds: float = AUDIO_S, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        n = int(seconds * rate)
        w.writeframes(
            b"".join(
                struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
                for i in range(n)
            )
        )
    return buf.getvalue()


def _png(size: int = IMAGE_PX) -> bytes:
    rows = b"".join(
        b"\x00" + b"".join(bytes((x * 255 // size, y * 255 // size, 128)) for x in range(size))
        for y in range(size)
    )

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    max_tokens: int = 128
    min_tokens: int | None = None
    prompt: str = PROMPT


def request_body(probe: Probe, model: str, seq: int, s: ProbeSettings) -> dict[str, Any]:
    """The chat request of one probe; `seq` varies the prompt's start (no shared prefix
    beyond the chat template between repetitions)."""
    text = f"({seq}) {s.prompt}"
    content: Any = text
    if probe.input == "audio":
        part = {"type": "audio_url", "audio_url": {"url": _data_url("audio/wav", _wav())}}
        content = [part, {"type": "text", "text": text}]
    elif probe.input == "image":
        part = {"type": "image_url", "image_url": {"url": _data_url("image/png", _png())}}
        content = [part, {"type": "text", "text": text}]
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "max_tokens": s.max_tokens,
        "modalities": MODALITIES[probe.metric],
        "stream_options": {"include_usage": True},  # the answer length, in the last event
        "return_stage_metrics": True,  # the engine's own per-stage timing, on the events
    }
    if s.min_tokens is not None:
        body["min_tokens"] = s.min_tokens
    return body


class ProbeRefused(RuntimeError):
    """The server answered a probe with an error, or without the awaited output."""


@dataclass(frozen=True, slots=True)
class Server:
    """Where the server listens: scheme-less host, port and path prefix."""

    host: str
    port: int
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> Server:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname:
            raise VllmOmniCalibrationError(f"--url {url}: give http://HOST:PORT")
        return cls(parts.hostname, parts.port or 80, parts.path.rstrip("/"))

    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.prefix}"

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get("VLLM_API_KEY")  # what `vllm serve --api-key` reads too
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request("GET", self.prefix + path, headers=self._headers())
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def stream(self, body: dict[str, Any], output: str, timeout: float) -> Sample:
        """Send `body` and read its stream to the end (so the next probe runs alone): the
        first `output` event's time, every text delta's time and the answer length."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        data = json.dumps(body).encode()
        first: float | None = None
        text_at: list[float] = []
        tokens: int | None = None
        engine_itl: list[float] | None = None
        seen: set[str] = set()
        try:
            t0 = time.perf_counter()
            conn.request("POST", self.prefix + "/v1/chat/completions", data, self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                raise ProbeRefused(f"HTTP {resp.status}: {_error_text(resp.read())}")
            for raw in resp:  # SSE lines (http.client undoes the chunked encoding)
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                now = time.perf_counter() - t0
                event = json.loads(payload)
                if "error" in event:
                    raise ProbeRefused(f"error in the stream: {_error_text(payload)}")
                shared = ((event.get("metrics") or {}).get("stage_metrics") or {}).get(SHARED)
                if shared and shared.get("vllm_itls_ms") is not None:
                    engine_itl = [ms / 1e3 for ms in shared["vllm_itls_ms"]]  # the latest holds all
                usage = event.get("usage") or {}
                if not event.get("choices") and usage.get("completion_tokens") is not None:
                    tokens = int(usage["completion_tokens"])  # the final usage event only
                modality = event.get("modality") or "text"
                if _has_payload(event):
                    seen.add(modality)
                    if first is None and modality == output:
                        first = now
                    if modality == "text":
                        text_at.append(now)
        finally:
            conn.close()
        if first is None:
            got = ", ".join(sorted(seen)) or "nothing"
            raise ProbeRefused(f"the answer streamed {got} but no {output}")
        return Sample(first, tuple(text_at), tokens, engine_itl)


@dataclass(frozen=True, slots=True)
class Sample:
    """One probe's stream, times in seconds from sending the request."""

    first_s: float  # first event carrying the class's output
    text_at_s: tuple[float, ...]  # every event carrying text, in arrival order
    tokens: int | None  # usage.completion_tokens (None: the server sent no usage)
    engine_itl_s: list[float] | None  # the shared stage's inter-token latencies, engine-side

    def intervals(self) -> list[float]:
        """Inter-token intervals of the streamed text after its first token."""
        t = self.text_at_s
        return [b - a for a, b in itertools.pairwise(t)]


def _has_payload(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("audio"):
            return True
    return False


def _error_text(raw: bytes) -> str:
    try:
        err = json.loads(raw)
        return str((err.get("error") or {}).get("message") or err)[:400]
    except (ValueError, AttributeError):
        return raw.decode(errors="replace")[:400]


def served_models(server: Server) -> list[str]:
    status, raw = server.get("/v1/models")
    if status != 200:
        raise OSError(f"GET /v1/models answered {status}")
    return [m["id"] for m in json.loads(raw).get("data", [])]


# -- the server this command starts -----------------------------------------------------------


def server_env() -> dict[str, str]:
    """This process's environment with HorizonServe off: the engine as shipped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORIZONSERVE_")}
    env["HORIZONSERVE_VLLM"] = "0"
    return env


def serve_command(
    args: argparse.Namespace, model: str, port: int, deploy: Path | None = None
) -> list[str]:
    """`vllm serve MODEL --omni` as the operator's serving container runs it, on loopback.
    `deploy`: the deploy file the plugin makes the pipeline's default when it is on (off
    here), passed as --deploy-config unless --serve-args names one: the same stage layout."""
    raw = args.vllm_command or "vllm"
    try:
        vllm = shlex.split(raw)
        extra = shlex.split(args.serve_args or "")
    except ValueError as exc:
        raise VllmOmniCalibrationError(f"--vllm-command / --serve-args: {exc}") from None
    if not vllm or shutil.which(vllm[0]) is None:
        where = "on PATH" if args.vllm_command is None else "executable"
        raise VllmOmniCalibrationError(
            f"--vllm-command: {vllm[0] if vllm else raw!r} is not {where}; install vLLM-Omni, "
            "pass --vllm-command /path/to/vllm, or --url of a running server"
        )
    base = [*vllm, "serve", model, "--omni", "--host", "127.0.0.1", "--port", str(port)]
    named = any(a == "--deploy-config" or a.startswith("--deploy-config=") for a in extra)
    if deploy is not None and not named:
        base += ["--deploy-config", str(deploy)]
    return base + extra


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


class StartedServer:
    """`vllm serve` in its own session (stopped with its stage processes), log to a file."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.cmd, self.log = cmd, log
        with log.open("w") as fh:
            self.proc = subprocess.Popen(
                cmd, env=server_env(), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, server: Server, timeout_s: float, model_opt: str) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise VllmOmniCalibrationError(
                    f"--model {model_opt} / --serve-args: `{shlex.join(self.cmd)}` exited with "
                    f"status {self.proc.returncode} before it was ready; its log {self.log} "
                    "ends:\n" + _tail(self.log)
                )
            try:
                if server.get("/v1/models", timeout=5.0)[0] == 200:
                    return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(POLL_S)
        raise VllmOmniCalibrationError(
            f"--start-timeout {timeout_s:g}: the server was not ready in time (log {self.log}):\n"
            + _tail(self.log)
        )

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGINT, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


# -- measuring ----------------------------------------------------------------------------------


def measure(
    server: Server,
    model: str,
    probes: list[Probe],
    warmup: int,
    repeats: int,
    settings: ProbeSettings,
    timeout_s: float,
    where: str,
    say: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """Per class, each request alone (closed loop), warm-up first: the measured requests'
    first-response latencies, their streamed text's inter-token intervals (one list per
    request) and answer lengths. `where` names the server in errors (the option that chose
    it, or its log)."""
    out: dict[str, dict[str, Any]] = {}
    seq = 0
    for probe in probes:
        t0 = time.monotonic()
        lat: list[float] = []
        gaps: list[list[float]] = []
        tokens: list[int | None] = []
        engine: list[list[float] | None] = []
        for i in range(warmup + repeats):
            body = request_body(probe, model, seq, settings)
            seq += 1
            try:
                x = server.stream(body, probe.output, timeout_s)
            except ProbeRefused as exc:
                why = str(exc)
                hint = ""
                if "Unsupported output modalities" in why or f"no {probe.output}" in why:
                    hint = (
                        f" (the model serves no {probe.output} output: leave the class out "
                        "with --classes, or check --model / --pipeline)"
                    )
                raise VllmOmniCalibrationError(
                    f"--classes: class {probe.name!r} cannot be probed: {why}{hint}"
                ) from None
            except (OSError, http.client.HTTPException, ValueError) as exc:
                raise VllmOmniCalibrationError(
                    f"{where}: class {probe.name!r}: the request failed ({exc})"
                ) from None
            if i >= warmup:
                lat.append(x.first_s)
                gaps.append([round(g, 6) for g in x.intervals()])
                tokens.append(x.tokens)
                engine.append(
                    None if x.engine_itl_s is None else [round(g, 6) for g in x.engine_itl_s]
                )
        wall = time.monotonic() - t0
        out[probe.name] = {
            "metric": probe.metric.value,
            "input": probe.input,
            "output": probe.output,
            "latency_s": lat,
            "token_interval_s": gaps,
            "engine_token_interval_s": engine,
            "answer_tokens": tokens,
            "warmup": warmup,
            "wall_s": round(wall, 3),
            "body": _short_body(request_body(probe, model, 0, settings)),
        }
        say(
            f"[calibrate] {probe.name}: {len(lat)} solo requests, first {probe.output} "
            f"p50 {sorted(lat)[len(lat) // 2]:.3f} s, p95 {p95(lat):.3f} s ({wall:.0f} s)"
        )
    return out


def _short_body(body: dict[str, Any]) -> dict[str, Any]:
    """The request as recorded in the raw log: media data URLs shortened."""
    text = json.dumps(body)
    for prefix in ("data:audio/wav;base64,", "data:image/png;base64,"):
        start = text.find(prefix)
        if start >= 0:
            end = text.index('"', start)
            text = text[:start] + prefix + f"<{end - start - len(prefix)} chars>" + text[end:]
    return json.loads(text)
