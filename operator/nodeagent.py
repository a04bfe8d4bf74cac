"""Node-side glue of a serving pod: calibration artifacts between the node's ConfigMap and
the pod's artifact directory, then the real command.

    python3 -m horizonserve.operator.nodeagent restore --from STORED --to DIR -- CMD...
    python3 -m horizonserve.operator.nodeagent upload --from DIR --configmap NAME -- CMD...

`restore` (calibration init container, no API token): copies the artifacts the node's
ConfigMap holds (mounted read-only by the kubelet at STORED) into the writable DIR, so that
`horizonserve calibrate --mode auto` finds them and skips, then runs CMD.

`upload` (sidecar, the pod's only token): merge-patches the artifacts in DIR into the node's
ConfigMap (its Role allows `patch` on its OmniService's node ConfigMaps and nothing else; it
is told only its own node's name), then runs CMD. A failed upload is logged and never stops
the sidecar: the next pod calibrates again.

Keys: `artifact.<file name>` with characters a ConfigMap key cannot hold replaced by `_`.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from horizonserve.runtime.config import POD_NAMESPACE_ENV, SUMMARY_KEY

log = logging.getLogger("horizonserve.nodeagent")

ARTIFACT_PREFIX = "artifact."
MAX_UPLOAD_BYTES = 900 * 1024  # a ConfigMap holds at most 1 MiB, the summary included
_KEY_UNSAFE = re.compile(r"[^-._a-zA-Z0-9]")


def artifact_key(file_name: str) -> str:
    return ARTIFACT_PREFIX + _KEY_UNSAFE.sub("_", file_name)[:200]


def restore(stored: Path, target: Path) -> list[Path]:
    """Copy every stored artifact into `target`; returns the files written."""
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(stored.glob(f"{ARTIFACT_PREFIX}*")) if stored.is_dir() else ():
        out = target / path.name.removeprefix(ARTIFACT_PREFIX)
        out.write_bytes(path.read_bytes())
        written.append(out)
    return written


def artifacts(directory: Path) -> dict[str, str]:
    """ConfigMap data for the artifacts in `directory` (JSON files only, newest first, while
    they fit)."""
    data: dict[str, str] = {}
    size = 0
    files = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in files if directory.is_dir() else ():
        if path.name == SUMMARY_KEY:
            continue
        text = path.read_text()
        if size + len(text) > MAX_UPLOAD_BYTES:
            log.warning("artifact %s left out: the node's ConfigMap would exceed 1 MiB", path)
            continue
        data[artifact_key(path.name)] = text
        size += len(text)
    return data


def upload(directory: Path, configmap: str, namespace: str) -> int:
    """Merge-patch the artifacts into the ConfigMap; returns how many were sent."""
    data = artifacts(directory)
    if not data:
        return 0
    from kubernetes import client, config

    config.load_incluster_config()
    client.CoreV1Api().patch_namespaced_config_map(configmap, namespace, {"data": data})
    return len(data)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m horizonserve.operator.nodeagent")
    sub = parser.add_subparsers(dest="step", required=True)
    r = sub.add_parser("restore", help="copy stored artifacts into the artifact directory")
    r.add_argument("--from", dest="source", type=Path, required=True)
    r.add_argument("--to", dest="target", type=Path, required=True)
    u = sub.add_parser("upload", help="patch new artifacts into the node's ConfigMap")
    u.add_argument("--from", dest="source", type=Path, required=True)
    u.add_argument("--configmap", required=True)
    for p in (r, u):
        p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.step == "restore":
        for path in restore(args.source, args.target):
            log.info("restored %s from the node's ConfigMap", path)
    else:
        try:
            sent = upload(args.source, args.configmap, os.environ.get(POD_NAMESPACE_ENV, ""))
            log.info("uploaded %d artifact(s) into ConfigMap %s", sent, args.configmap)
        except Exception as exc:  # API away, RBAC: calibration is kept in the pod only
            log.warning("uploading artifacts into ConfigMap %s failed: %s", args.configmap, exc)
    if not command:
        return 0
    sys.stdout.flush()
    os.execvp(command[0], command)  # the pod's own command, given by the operator
    return 0  # pragma: no cover


if __name__ == "__main__":
    raise SystemExit(main())
