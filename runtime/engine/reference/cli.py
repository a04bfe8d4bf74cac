"""`horizonserve serve`: run the reference stage pipeline behind its HTTP API."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from horizonserve.runtime.config import PolicyName, ServingConfig
from horizonserve.runtime.engine.reference.pipeline import (
    DOWNSTREAM_STAGES,
    Pipeline,
    PipelineOptions,
)
from horizonserve.runtime.engine.reference.presets import PRESETS
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
        "--config", type=Path, help="ServingConfig JSON (classes, SLOs, ladder, control)"
    )
    parser.add_argument(
        "--downstream",
        default=",".join(DOWNSTREAM_STAGES),
        help="downstream stages to run, comma separated (default speech,image)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-batch", type=int, help="shared-stage KV slots")
    parser.add_argument("--max-len", type=int, help="shared-stage tokens per slot")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per stage (CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-warmup", action="store_true", help="skip per-level warm-up")
    parser.add_argument(
        "--stats-file",
        type=Path,
        default=None,
        help="per-class stats for the node sidecar (default $HORIZONSERVE_STATS_FILE or "
        "/dev/shm/horizonserve/node-stats.json)",
    )
    parser.add_argument(
        "--stats-interval", type=float, default=5.0, help="seconds between stats-file writes"
    )


def options_from_args(args: argparse.Namespace) -> PipelineOptions:
    config = None
    if args.config is not None:
        config = ServingConfig.model_validate_json(args.config.read_text())
    policy = args.policy or (config.policy.value if config else PolicyName.HORIZON.value)
    downstream = tuple(s.strip() for s in args.downstream.split(",") if s.strip())
    limits: dict[str, Any] = {}
    if args.max_batch:
        limits["max_batch"] = args.max_batch
    if args.max_len:
        limits["max_len"] = args.max_len
    return PipelineOptions(
        preset=args.preset,
        device=args.device,
        policy=policy,
        config=config,
        downstream=downstream,
        mps=args.mps,
        seed=args.seed,
        threads=args.threads,
        warmup=not args.no_warmup,
        limits=limits,
    )


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


def run(args: argparse.Namespace) -> int:
    from horizonserve.runtime.engine.reference.server import ApiServer

    pipeline = Pipeline(options_from_args(args))
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    pipeline.start()
    try:
        server = ApiServer(pipeline, args.host, args.port)
        server.serve_in_thread()
        info = {name: i.get("sm_cap") for name, i in pipeline.stage_info.items()}
        print(
            f"horizonserve serve: {pipeline.options.preset} on {pipeline.device}, policy "
            f"{pipeline.config.policy.value if pipeline.config else '?'}, stages {info}; "
            f"listening on {server.url}",
            flush=True,
        )
        stats = StatsWriter(pipeline, args.stats_file or stats_path(), args.stats_interval)
        while not stop.wait(min(0.5, args.stats_interval)):
            if not pipeline.health()["ok"]:
                log.error("a stage failed: %s", pipeline.health())
                return 1
            stats.maybe_write()
        server.shutdown()
        server.server_close()
    finally:
        pipeline.stop()
    return 0
