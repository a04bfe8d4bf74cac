"""`horizonserve calibrate --backend vllm-omni`: the SLO table measured on vLLM-Omni itself.

    horizonserve calibrate --backend vllm-omni [--model M] [--pipeline P] [--out-dir DIR]
        [--url URL | --vllm-command CMD --serve-args ARGS] [--classes a,b] [--solo-requests N]

Starts `vllm serve <model> --omni` (the serving container's command; `--serve-args` appends
to it, e.g. a deploy file) with HorizonServe off (HORIZONSERVE_VLLM=0), or uses the server at
`--url`. Each class is then probed alone: `--warmup` unmeasured requests, then
`--solo-requests` measured ones, one at a time (the next is sent when the previous stream has
ended). The first-response latency is taken at the client from the streamed chat completion:
from sending the request to the first event carrying the class metric's output (ttft: a text
token, ttfo: an audio chunk, e2e: the image). Nothing here imports vLLM: the process talks
HTTP, so a GPU node and a CPU machine run the same code; only the started command differs.

Writes `<pipeline>--<gpu>--<driver>--vllm-omni.json` into --out-dir: a `CalibrationArtifact`
whose `solo_p95_s` holds the measured classes (nearest-rank p95, as the reference calibration
takes it). The plugin applies it as it applies any artifact (`settings.resolve_config`:
`HORIZONSERVE_CALIBRATION_ARTIFACT`, or the newest match for model + GPU + driver in
`HORIZONSERVE_ARTIFACT_DIR`): measured classes get their solo p95, so their SLO targets;
classes not measured keep the ServingConfig's. The fields this calibration does not measure
(ladder, B_sat, stage costs) are carried over from the newest reference-calibration artifact
for this pipeline and GPU in --out-dir (`--backend reference` measured them here), else from
the shipped estimate; `notes` and `source` say which.
Beside it: `.raw.log` (every sample, the requests and the server command), `.summary.txt`,
and the server's own log `.serve.log` when this command started it.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import math
import os
import platform
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from horizonserve.runtime import config as cfg
from horizonserve.runtime.artifact import (
    ESTIMATE_ARTIFACT,
    CalibrationArtifact,
    GpuKey,
    PipelineCalibration,
    load_artifact,
    load_packaged,
)
from horizonserve.runtime.calibrate.derive import p95
from horizonserve.runtime.calibrate.stats import quantile_ci

BACKEND = "vllm-omni"
SUFFIX = "--vllm-omni"  # artifact stem suffix: never overwrites the reference calibration's
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
CARRIED_FIELDS = ("ladder", "b_sat", "shared", "downstream", "sharing", "pressure")


class VllmOmniCalibrationError(ValueError):
    """A refused or failed vLLM-Omni calibration: one message naming the option and the fix."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `--backend vllm-omni` (refused with the reference backend)."""
    g = parser.add_argument_group("--backend vllm-omni")
    g.add_argument(
        "--model",
        help="model to serve, id or directory (default: the ServingConfig's, else the "
        "pipeline's); with --url: the served model (default: the server's only one)",
    )
    g.add_argument("--url", help="calibrate the vLLM-Omni server at this URL (started by you)")
    g.add_argument(
        "--vllm-command",
        help="how to run vLLM (default: `vllm` from PATH), e.g. '/opt/venv/bin/vllm'",
    )
    g.add_argument(
        "--serve-args",
        help="more arguments for `vllm serve MODEL --omni`, one string, e.g. "
        "--serve-args='--deploy-config deploy.yaml'",
    )
    g.add_argument(
        "--classes",
        help="classes to probe, comma separated (default: every class of the pipeline whose "
        f"input is one of {', '.join(INPUTS)})",
    )
    g.add_argument("--warmup", type=int, help="unmeasured requests per class first (default 2)")
    g.add_argument("--max-tokens", type=int, help="answer length cap of a probe (default 128)")
    g.add_argument(
        "--min-tokens",
        type=int,
        help="fixed answer length for random-weight models (default: the model decides)",
    )
    g.add_argument(
        "--start-timeout", type=float, help="seconds the server may take to start (default 900)"
    )
    g.add_argument("--request-timeout", type=float, help="seconds one probe may take (default 600)")


# Options that only one backend reads: a value given for the other is refused.
OWN_OPTIONS = (
    "model", "url", "vllm_command", "serve_args", "classes", "warmup", "max_tokens",
    "min_tokens", "start_timeout", "request_timeout",
)  # fmt: skip
REFERENCE_ONLY = ("levels", "resume", "no_mps", "no_baseline", "allow_cpu_full")


def option(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_backend_options(args: argparse.Namespace) -> None:
    """Refuse an option the chosen backend does not read (naming it)."""
    if args.backend == BACKEND:
        given = [n for n in REFERENCE_ONLY if getattr(args, n, None)]
        if args.device != "auto":
            given.append("device")
        if given:
            raise VllmOmniCalibrationError(
                f"{option(given[0])}: an option of the reference backend; --backend vllm-omni "
                "measures the served engine (leave it out)"
            )
        return
    given = [n for n in OWN_OPTIONS if getattr(args, n, None) is not None]
    if given:
        raise VllmOmniCalibrationError(
            f"{option(given[0])}: an option of --backend vllm-omni (the default backend is "
            "the reference engine)"
        )


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

    def first_response(self, body: dict[str, Any], output: str, timeout: float) -> float:
        """Seconds from sending `body` to the first streamed event carrying `output`; reads
        the stream to its end (so the next probe runs alone)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        data = json.dumps(body).encode()
        try:
            t0 = time.perf_counter()
            conn.request("POST", self.prefix + "/v1/chat/completions", data, self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                raise ProbeRefused(f"HTTP {resp.status}: {_error_text(resp.read())}")
            first: float | None = None
            seen: set[str] = set()
            for raw in resp:  # SSE lines (http.client undoes the chunked encoding)
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                event = json.loads(payload)
                if "error" in event:
                    raise ProbeRefused(f"error in the stream: {_error_text(payload)}")
                modality = event.get("modality") or "text"
                if _has_payload(event):
                    seen.add(modality)
                    if first is None and modality == output:
                        first = time.perf_counter() - t0
        finally:
            conn.close()
        if first is None:
            got = ", ".join(sorted(seen)) or "nothing"
            raise ProbeRefused(f"the answer streamed {got} but no {output}")
        return first


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


def serve_command(args: argparse.Namespace, model: str, port: int) -> list[str]:
    """`vllm serve MODEL --omni` as the operator's serving container runs it, on loopback."""
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
    """Per class: warm-up then measured latencies, each request alone (closed loop). `where`
    names the server in errors (the option that chose it, or its log)."""
    out: dict[str, dict[str, Any]] = {}
    seq = 0
    for probe in probes:
        t0 = time.monotonic()
        lat: list[float] = []
        for i in range(warmup + repeats):
            body = request_body(probe, model, seq, settings)
            seq += 1
            try:
                x = server.first_response(body, probe.output, timeout_s)
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
                lat.append(x)
        wall = time.monotonic() - t0
        out[probe.name] = {
            "metric": probe.metric.value,
            "input": probe.input,
            "output": probe.output,
            "latency_s": lat,
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


# -- the artifact ------------------------------------------------------------------------------


def gpu_key() -> GpuKey:
    """The key of this machine's GPU (NVML name and driver; SMs and memory from PyTorch), or a
    CPU key (the estimate's SM count: no ladder is measured there)."""
    from horizonserve.runtime.artifact_store import detect_gpu

    tpl = load_packaged(ESTIMATE_ARTIFACT).gpu
    gpu = detect_gpu()
    if gpu is None:
        return GpuKey(
            name=f"cpu ({platform.machine()})",
            driver="unknown",
            sm_count=tpl.sm_count,
            memory_gib=tpl.memory_gib,
        )
    sms, mem = _cuda_props()
    if sms is None:
        if gpu.name != tpl.name:
            raise VllmOmniCalibrationError(
                f"cannot read the SM count of {gpu.name} (the artifact is keyed by it): "
                "needs PyTorch with CUDA here (pip install 'horizonserve[gpu]')"
            )
        sms, mem = tpl.sm_count, tpl.memory_gib
    return GpuKey(name=gpu.name, driver=gpu.driver, sm_count=sms, memory_gib=mem)


def _cuda_props() -> tuple[int | None, float]:
    try:
        import torch

        if not torch.cuda.is_available():
            return None, 0.0
        props = torch.cuda.get_device_properties(0)
        return int(props.multi_processor_count), round(props.total_memory / 2**30, 2)
    except ImportError:
        return None, 0.0


def base_entry(out_dir: Path, pipeline: str, key: GpuKey) -> tuple[PipelineCalibration, str]:
    """Where the fields this calibration does not measure come from, and its name: the newest
    reference-calibration artifact in `out_dir` for this pipeline on this GPU (name, driver,
    SMs: its ladder, B_sat and stage costs were measured here), else the shipped estimate."""
    found = []
    for path in sorted(out_dir.glob("*.json")) if out_dir.is_dir() else []:
        if path.name.endswith(SUFFIX + ".json"):
            continue
        try:
            art = load_artifact(path)
        except (OSError, ValueError):  # a checkpoint, another JSON file
            continue
        entry = art.pipelines.get(pipeline)
        same_gpu = (art.gpu.name, art.gpu.driver, art.gpu.sm_count) == (
            key.name,
            key.driver,
            key.sm_count,
        )
        if entry is not None and same_gpu:
            found.append((path.stat().st_mtime, path.name, entry))
    if found:
        _, name, entry = max(found, key=lambda f: f[0])
        return entry, f"{name} (the reference calibration of this GPU)"
    return load_packaged(ESTIMATE_ARTIFACT).pipeline(pipeline), f"{ESTIMATE_ARTIFACT} (estimate)"


def build_artifact(
    pipeline: str,
    model: str,
    key: GpuKey,
    solo: dict[str, dict[str, Any]],
    command: str,
    when: str,
    base: tuple[PipelineCalibration, str] | None = None,
) -> CalibrationArtifact:
    """`base`'s entry for `pipeline` (default: the shipped estimate's), its solo p95 table
    replaced by the measured one: only the measured classes (the plugin keeps the
    ServingConfig's solo p95 for the others)."""
    tpl, origin = base or (
        load_packaged(ESTIMATE_ARTIFACT).pipeline(pipeline),
        f"{ESTIMATE_ARTIFACT} (estimate)",
    )
    ladder = tpl.ladder if tpl.ladder.total == key.sm_count else cfg.default_ladder(key.sm_count)
    p95s, cis, counts, walls = {}, {}, {}, {}
    carried = f"carried over from {origin}: calibrate --backend vllm-omni measures only solo_p95_s"
    notes = dict.fromkeys(CARRIED_FIELDS, carried)
    for name, rec in solo.items():
        lat = rec["latency_s"]
        p95s[name] = round(p95(lat), 5)
        est = quantile_ci(lat)
        cis[name] = (_r5(est.lo), _r5(est.hi))
        counts[name] = len(lat)
        walls[name] = float(rec["wall_s"])
        notes[f"solo_p95_s.{name}"] = (
            f"measured: vLLM-Omni, first {rec['output']} at the client, {len(lat)} solo "
            f"requests after {rec['warmup']} warm-up"
        )
    source = (
        f"solo_p95_s measured on vLLM-Omni (HorizonServe off) by horizonserve calibrate "
        f"--backend vllm-omni on {when}: `{command}`. Each class alone, one streamed chat "
        "request at a time; first response taken at the client (first text token / audio "
        "chunk / image); nearest-rank p95. Classes not listed in solo_p95_s were not measured. "
        f"Every other field is carried over from {origin}."
    )
    entry = tpl.model_copy(
        update={
            "model": model,
            "ladder": ladder,
            "solo_p95_s": p95s,
            "solo_p95_source": "measured: vLLM-Omni, client-side first response, solo",
            "solo_p95_ci_s": cis,
            "solo_samples": counts,
            "solo_wall_s": walls,
            "notes": dict(sorted(notes.items())),
        }
    )
    entry = type(entry).model_validate(entry.model_dump())  # validate the replaced fields
    return CalibrationArtifact(source=source, created=when, gpu=key, pipelines={pipeline: entry})


def _r5(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def summary(
    art: CalibrationArtifact,
    pipeline: str,
    slo: cfg.SloTable,
    solo: dict[str, dict[str, Any]],
    skipped: list[str],
) -> str:
    """The measured SLO table as text: per class its samples, solo p50 / p95 and target."""
    entry = art.pipelines[pipeline]
    lines = [
        f"vLLM-Omni calibration of {entry.model} ({pipeline}) on {art.gpu.name}",
        f"{'class':16} {'metric':6} {'n':>3} {'solo p50 s':>10} {'solo p95 s':>10} {'SLO s':>8}",
    ]
    for c in slo.classes:
        if c.name not in entry.solo_p95_s:
            continue
        lat = sorted(solo[c.name]["latency_s"])
        v = entry.solo_p95_s[c.name]
        mult = c.slo_multiplier if c.slo_multiplier is not None else slo.multiplier
        lines.append(
            f"{c.name:16} {c.metric.value:6} {len(lat):>3} {lat[len(lat) // 2]:>10.3f} "
            f"{v:>10.3f} {v * mult:>8.3f}"
        )
    if skipped:
        lines.append(f"not measured (no probe input): {', '.join(skipped)}")
    return "\n".join(lines)


# -- the command ---------------------------------------------------------------------------------


def serving_slo(pipeline: str) -> tuple[cfg.SloTable, str]:
    """The SLO table (multipliers) and model of the ServingConfig in the environment, else
    of the shipped pipeline."""
    raw = os.environ.get(cfg.SERVING_CONFIG_ENV)
    if raw:
        serving = cfg.ServingConfig.model_validate_json(raw)
        if serving.pipeline == pipeline:
            return serving.slo, serving.model
    spec = cfg.load_pipeline(pipeline)
    return spec.slo, spec.model


# The artifact stem of (pipelines, GPU name, driver): the entry point's naming rule.
StemOf = Callable[[tuple[str, ...], str, str], str]


def run(args: argparse.Namespace, pipelines: tuple[str, ...], command: str, stem_of: StemOf) -> int:
    """Calibrate `pipelines[0]` on vLLM-Omni; write the artifact. Errors: this module's."""
    if len(pipelines) != 1:
        raise VllmOmniCalibrationError(
            f"--pipeline {','.join(pipelines)}: --backend vllm-omni calibrates one pipeline, "
            "the served model's"
        )
    pipeline = pipelines[0]
    slo, default_model = serving_slo(pipeline)
    probes, skipped = probes_for(slo, args.classes)
    repeats = args.solo_requests if args.solo_requests is not None else (5 if args.quick else 20)
    warmup = 2 if args.warmup is None else args.warmup
    for name, value, low in (("solo-requests", repeats, 1), ("warmup", warmup, 0)):
        if value < low:
            raise VllmOmniCalibrationError(f"--{name} {value}: at least {low}")
    max_tokens = 128 if args.max_tokens is None else args.max_tokens
    settings = ProbeSettings(max_tokens=max_tokens, min_tokens=args.min_tokens)
    if settings.max_tokens < 1 or (settings.min_tokens or 0) > settings.max_tokens:
        raise VllmOmniCalibrationError(
            f"--max-tokens {settings.max_tokens} / --min-tokens {settings.min_tokens}: need "
            "1 <= min <= max"
        )
    if args.url:
        for name in ("vllm_command", "serve_args", "start_timeout"):
            if getattr(args, name) is not None:
                raise VllmOmniCalibrationError(
                    f"{option(name)}: only for a server this command starts (not with --url)"
                )
    key = gpu_key()
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = stem_of((pipeline,), key.name, key.driver) + SUFFIX
    started: StartedServer | None = None
    t0 = time.monotonic()
    if args.url:
        server = Server.parse(args.url)
        try:
            models = served_models(server)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise VllmOmniCalibrationError(
                f"--url {args.url}: no vLLM-Omni server answers ({exc})"
            ) from None
        model = args.model or (models[0] if len(models) == 1 else "")
        if model not in models:
            raise VllmOmniCalibrationError(
                f"--model {args.model or '(not given)'}: the server at --url serves {models}"
            )
        start_s = None
        server_cmd = f"(running server at {args.url})"
        where = f"--url {args.url}"
    else:
        model = args.model or default_model
        port = _free_port()
        cmd = serve_command(args, model, port)
        server_cmd = shlex.join(cmd)
        print(f"[calibrate] starting {server_cmd}", flush=True)
        started = StartedServer(cmd, out_dir / f"{stem}.serve.log")
        server = Server("127.0.0.1", port)
        where = f"the server this command started (log {started.log})"
    try:
        if started is not None:
            start_s = started.wait_ready(server, args.start_timeout or 900.0, model)
            print(f"[calibrate] server ready in {start_s:.0f} s", flush=True)
        solo = measure(
            server, model, probes, warmup, repeats, settings, args.request_timeout or 600.0,
            where, say=lambda s: print(s, flush=True),
        )  # fmt: skip
    finally:
        if started is not None:
            started.stop()
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    base = base_entry(out_dir, pipeline, key)
    art = build_artifact(pipeline, model, key, solo, command, when, base)
    raw = {
        "backend": BACKEND,
        "command": command,
        "server_command": server_cmd,
        "server_start_s": start_s,
        "measured_at": when,
        "pipeline": pipeline,
        "model": model,
        "gpu": key.model_dump(),
        "settings": {
            "warmup": warmup,
            "repeats": repeats,
            "max_tokens": settings.max_tokens,
            "min_tokens": settings.min_tokens,
        },
        "skipped": skipped,
        "solo": solo,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    path = out_dir / f"{stem}.json"
    path.write_text(art.model_dump_json(indent=2) + "\n")
    (out_dir / f"{stem}.raw.log").write_text(json.dumps(raw, indent=1) + "\n")
    text = summary(art, pipeline, slo, solo, skipped)
    (out_dir / f"{stem}.summary.txt").write_text(f"{command}\n{text}\n")
    print(text)
    print(f"artifact: {path} ({time.monotonic() - t0:.0f} s)")
    return 0


def existing(args: argparse.Namespace, pipeline: str, stem_of: StemOf) -> Path | None:
    """This backend's artifact for `pipeline` on this machine in --out-dir, if present."""
    key = gpu_key()
    path = Path(args.out_dir) / (stem_of((pipeline,), key.name, key.driver) + SUFFIX + ".json")
    return path if path.is_file() else None
