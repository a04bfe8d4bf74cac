"""`horizonserve serve`: run the reference stage pipeline behind its HTTP API.

Every option is checked before anything starts: numbers while the command line is parsed
(`cli_types`), the rest (files, the config, classes, addresses, keys, the device) by
`option_problem`; a bad value is one line naming the option, exit code 2.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from horizonserve.runtime.cli_types import bounded, positive, positive_int
from horizonserve.runtime.config import PolicyName, ServingConfig
from horizonserve.runtime.engine.reference.access import (
    API_KEY_ENV,
    API_KEY_FILE_ENV,
    access_policy,
    read_key_file,
)
from horizonserve.runtime.engine.reference.pipeline import (
    DOWNSTREAM_STAGES,
    Pipeline,
    PipelineError,
    PipelineOptions,
)
from horizonserve.runtime.engine.reference.presets import PRESETS
from horizonserve.runtime.engine.reference.supervisor import RestartPolicy
from horizonserve.runtime.node_stats import class_summaries, stats_path, write_stats

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="model sizes")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda:N (default auto)")
    parser.add_argument(
        "--policy",
        choices=[p.value for p in PolicyName],
        default=None,
        help="scheduling policy (default: the config's, else horizon)",
    )
    parser.add_argument("--mps", action="store_true", help="share the GPU through MPS")
    parser.add_argument(
        "--window",
        type=bounded(1, 1 << 16, integer=True),
        help="vllm-omni-current: the talker's active-stream window K (default: its places)",
    )
    parser.add_argument(
        "--static-share",
        type=bounded(1, 1 << 16, integer=True),
        help="mps-static: the shared stage's SMs, the downstream stages the rest (default: "
        "runtime.baselines.static_share for the pipeline)",
    )
    parser.add_argument(
        "--config", type=Path, help="ServingConfig JSON (classes, SLOs, ladder, control)"
    )
    parser.add_argument(
        "--downstream",
        default=",".join(DOWNSTREAM_STAGES),
        help="downstream stages to run, comma separated (default speech,image,code2wav; "
        "speech brings code2wav, its vocoder, along)",
    )
    net = parser.add_argument_group("HTTP")
    net.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; in a pod give the pod IP or 0.0.0.0)",
    )
    net.add_argument(
        "--port",
        type=bounded(0, 65535, integer=True),
        default=8000,
        help="port (default 8000; 0: any)",
    )
    net.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on /v1/* (default ${API_KEY_ENV})",
    )
    net.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help=f"file of keys, one per line: KEY [CLASS,CLASS...] (default ${API_KEY_FILE_ENV})",
    )
    net.add_argument(
        "--allowed-classes",
        default=None,
        help="classes the --api-key (or, without keys, anyone) may request, comma separated "
        "(default: all)",
    )
    net.add_argument(
        "--backlog", type=bounded(1, 65535, integer=True), default=2048, help="listen backlog"
    )
    net.add_argument(
        "--max-connections",
        type=bounded(1, 100_000, integer=True),
        default=1024,
        help="open connections (default 1024; /health and /ready are served beyond it)",
    )
    net.add_argument(
        "--max-connections-per-client",
        type=positive_int,
        default=None,
        help="open connections one client address may hold (default: half --max-connections)",
    )
    net.add_argument("--served-model-name", default=None, help="the metrics' model_name label")
    sup = parser.add_argument_group("supervision")
    sup.add_argument(
        "--hang-timeout",
        type=bounded(0.1, 3600),
        default=5.0,
        help="seconds without a stage heartbeat before the stage is restarted (default 5)",
    )
    sup.add_argument(
        "--restart-backoff",
        type=bounded(0, 3600, low_open=True),
        default=0.5,
        help="seconds before the first restart of a failed stage; doubles up to 30 (default 0.5)",
    )
    sup.add_argument("--no-supervise", action="store_true", help="never restart a failed stage")
    parser.add_argument(
        "--max-batch", type=bounded(1, 4096, integer=True), help="shared-stage KV slots"
    )
    parser.add_argument(
        "--max-len", type=bounded(2, 65536, integer=True), help="shared-stage tokens per slot"
    )
    parser.add_argument(
        "--threads",
        type=bounded(1, 1024, integer=True),
        default=1,
        help="torch threads per stage (CPU)",
    )
    parser.add_argument("--seed", type=bounded(0, 2**32 - 1, integer=True), default=0)
    parser.add_argument("--no-warmup", action="store_true", help="skip per-level warm-up")
    parser.add_argument(
        "--stats-file",
        type=Path,
        default=None,
        help="per-class stats for the node sidecar (default $HORIZONSERVE_STATS_FILE or "
        "/dev/shm/horizonserve/node-stats.json)",
    )
    parser.add_argument(
        "--stats-interval",
        type=positive,
        default=5.0,
        help="seconds between stats-file writes",
    )


def options_from_args(args: argparse.Namespace) -> PipelineOptions:
    config = None
    if args.config is not None:
        config = ServingConfig.model_validate_json(args.config.read_text())
    policy = args.policy or (config.policy.value if config else PolicyName.HORIZON.value)
    downstream = tuple(s.strip() for s in args.downstream.split(",") if s.strip())
    limits: dict[str, Any] = {}
    if args.max_batch is not None:
        limits["max_batch"] = int(args.max_batch)
    if args.max_len is not None:
        limits["max_len"] = int(args.max_len)
    return PipelineOptions(
        preset=args.preset,
        device=args.device,
        policy=policy,
        config=config,
        downstream=downstream,
        mps=args.mps,
        window=args.window,
        static_share=args.static_share,
        seed=int(args.seed),
        threads=int(args.threads),
        warmup=not args.no_warmup,
        limits=limits,
        supervise=not args.no_supervise,
        hang_timeout_s=args.hang_timeout,
        restart=RestartPolicy(initial_s=args.restart_backoff),
        # One model_name on the serving and the sidecar's metrics: the config's model.
        model_name=args.served_model_name
        or (config.model if config else f"reference/{args.preset}"),
    )


class ExitWatch:
    """When `serve` gives up: no class can be served (not ready) and the pipeline cannot
    recover by itself (not live), both for `grace_s`. A stage that keeps failing (its restart
    budget spent) leaves only its own classes degraded; the others keep serving."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._since: float | None = None

    def give_up(self, live: bool, ready: bool, now: float) -> bool:
        if live or ready:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        return now - self._since > self.grace_s


class StatsWriter:
    """Rewrites the sidecar's per-class stats file every `interval` seconds."""

    def __init__(self, pipeline: Pipeline, path: Path, interval: float) -> None:
        self.pipeline = pipeline
        self.path = path
        self.interval = interval
        self._next = 0.0

    def maybe_write(self) -> None:
        now = time.monotonic()
        if now < self._next or self.pipeline.config is None:
            return
        self._next = now + self.interval
        metrics = self.pipeline.metrics
        classes = class_summaries(metrics, self.pipeline.config.slo, now)
        try:
            write_stats(self.path, classes, metrics.window.window_s, time.time())
        except OSError as exc:
            log.warning("cannot write stats file %s: %s", self.path, exc)


def _config_of(args: argparse.Namespace) -> tuple[ServingConfig | None, str | None]:
    if args.config is None:
        return None, None
    try:
        return ServingConfig.model_validate_json(args.config.read_text()), None
    except OSError as exc:
        return None, f"--config: cannot read {args.config} ({exc.strerror or exc})"
    except ValueError as exc:
        first = str(exc).splitlines()
        detail = " ".join(first[:3])[:300]
        return None, f"--config: {args.config} is not a valid ServingConfig ({detail})"


def option_problem(args: argparse.Namespace) -> str | None:
    """One line naming the first bad option (and how to fix it), or None. Checks what argparse
    cannot: files, the config and its classes, the downstream stages, the address, the keys,
    and options that depend on each other."""
    config, problem = _config_of(args)
    if problem:
        return problem
    if config is None:
        from horizonserve.runtime.engine.reference.defaults import reference_config

        config = reference_config(args.preset)
    known = set(DOWNSTREAM_STAGES)
    stages = [x.strip() for x in args.downstream.split(",") if x.strip()]
    bad = [x for x in stages if x not in known]
    if bad:
        return f"--downstream: unknown stage(s) {bad}; choose from {sorted(known)} or give ''"
    try:
        ipaddress.ip_address(args.host)
    except ValueError:
        try:
            socket.getaddrinfo(args.host, None, proto=socket.IPPROTO_TCP)
        except OSError:
            return f"--host: {args.host!r} is not an address or a name this host resolves"
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    if key is not None and (not key.strip() or any(c.isspace() for c in key.strip())):
        where = "--api-key" if args.api_key is not None else f"${API_KEY_ENV}"
        return f"{where}: blank or containing spaces; give a key of visible characters"
    key_file = args.api_key_file or (
        Path(os.environ[API_KEY_FILE_ENV]) if os.environ.get(API_KEY_FILE_ENV) else None
    )
    if key_file is not None:
        try:
            read_key_file(key_file)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            detail = f"{key_file}: {exc.strerror}" if isinstance(exc, OSError) else str(exc)
            return f"--api-key-file: {detail}"
    names = {c.name for c in config.slo.classes}
    if args.allowed_classes is not None:
        given = [c.strip() for c in args.allowed_classes.split(",") if c.strip()]
        unknown = sorted(set(given) - names)
        if not given or unknown:
            return (
                f"--allowed-classes: unknown class(es) {unknown or given}; known: {sorted(names)}"
            )
    if args.served_model_name is not None and not args.served_model_name.strip():
        return "--served-model-name: empty; give the model name the metrics should carry"
    per_client = args.max_connections_per_client
    if per_client is not None and per_client > args.max_connections:
        return f"--max-connections-per-client: {per_client:g} is above --max-connections"
    if args.stats_file is not None and args.stats_file.is_dir():
        return f"--stats-file: {args.stats_file} is a folder; give a file path"
    return None


def device_problem(device: str) -> str | None:
    """One line saying why the stages cannot run on `device` here, or None."""
    import importlib.util

    hint = "for a CPU run: horizonserve serve --device cpu --preset tiny"
    if importlib.util.find_spec("torch") is None:
        return f"PyTorch is not installed (pip install torch, or the [gpu] extra); {hint}"
    if device == "cpu":
        return None
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {device}: no CUDA GPU is visible to PyTorch; {hint}"
    if device.startswith("cuda:"):
        index = device.partition(":")[2]
        if not index.isdigit() or int(index) >= torch.cuda.device_count():
            n = torch.cuda.device_count()
            return f"--device {device}: this host has {n} GPU(s) (cuda:0..cuda:{n - 1})"
    elif device not in ("auto", "cuda"):
        return f"--device {device}: use auto, cpu or cuda:N"
    return None


def run(args: argparse.Namespace) -> int:
    from horizonserve.runtime.engine.reference.server import ApiServer, ServerSettings

    problem = option_problem(args) or device_problem(args.device)
    if problem is not None:
        print(f"horizonserve serve: error: {problem}", file=sys.stderr)
        return 2
    keys, anonymous = access_policy(args.api_key, args.api_key_file, args.allowed_classes)
    settings = ServerSettings(
        backlog=int(args.backlog),
        max_connections=int(args.max_connections),
        max_connections_per_client=(
            None
            if args.max_connections_per_client is None
            else int(args.max_connections_per_client)
        ),
        api_keys=keys,
        anonymous_classes=anonymous,
    )
    if not keys and args.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("serving on %s without an API key: anyone who reaches it may use it", args.host)
    pipeline = Pipeline(options_from_args(args))
    stop = threading.Event()
    # Bind before the (slow) stage start-up: a taken port fails at once.
    server = ApiServer(pipeline, args.host, int(args.port), settings)

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: refusing new requests and shutting down", signum)
        pipeline.refuse_new()
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        try:
            pipeline.start()
        except PipelineError as exc:
            print(f"horizonserve serve: error: {exc}", file=sys.stderr)
            return 1
        server.serve_in_thread()
        info = {name: i.get("sm_cap") for name, i in pipeline.stage_info.items()}
        print(
            f"horizonserve serve: {pipeline.options.preset} on {pipeline.device}, policy "
            f"{pipeline.config.policy.value if pipeline.config else '?'}, stages {info}; "
            f"listening on {server.url}",
            flush=True,
        )
        stats = StatsWriter(pipeline, args.stats_file or stats_path(), args.stats_interval)
        watch = ExitWatch(10 * args.hang_timeout)
        while not stop.wait(min(0.5, args.stats_interval)):
            if not server.running:
                log.error("the HTTP server stopped")
                return 1
            if watch.give_up(pipeline.live(), pipeline.ready(), time.monotonic()):
                log.error("the pipeline cannot recover: %s", pipeline.health())
                return 1
            stats.maybe_write()
    finally:
        server.shutdown()
        server.server_close()
        pipeline.stop()
    return 0
