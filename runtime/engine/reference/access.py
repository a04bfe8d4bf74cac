"""Who may call the reference server's /v1 API and which classes they may request.

Keys follow `vllm serve --api-key`: a client sends `Authorization: Bearer <key>`. A key may be
limited to some classes (the class policy); a request for another class gets 403. Keys come
from `--api-key` / $HORIZONSERVE_API_KEY (classes: `--allowed-classes`) and from a key file
(`--api-key-file` / $HORIZONSERVE_API_KEY_FILE, e.g. a mounted Kubernetes Secret), one key a
line: `KEY` or `KEY CLASS,CLASS`; blank lines and lines starting with # are skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

API_KEY_ENV = "HORIZONSERVE_API_KEY"
API_KEY_FILE_ENV = "HORIZONSERVE_API_KEY_FILE"

KeyPolicy = dict[str, frozenset[str] | None]


def _classes(text: str | None) -> frozenset[str] | None:
    if text is None or not text.strip():
        return None
    return frozenset(c.strip() for c in text.split(",") if c.strip())


def read_key_file(path: Path) -> KeyPolicy:
    """Keys and their classes from a key file; ValueError names the bad line."""
    keys: KeyPolicy = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) > 2:
            raise ValueError(f"{path}:{n}: expected 'KEY' or 'KEY CLASS,CLASS'")
        keys[parts[0]] = _classes(parts[1] if len(parts) == 2 else None)
    if not keys:
        raise ValueError(f"{path}: no keys in the key file")
    return keys


def access_policy(
    api_key: str | None, key_file: Path | None, allowed_classes: str | None
) -> tuple[KeyPolicy, frozenset[str] | None]:
    """(keys -> allowed classes, classes anonymous clients may request when no key is set)."""
    api_key = api_key or os.environ.get(API_KEY_ENV) or None
    file_env = os.environ.get(API_KEY_FILE_ENV)
    key_file = key_file or (Path(file_env) if file_env else None)
    keys: KeyPolicy = {}
    if key_file is not None:
        keys.update(read_key_file(key_file))
    classes = _classes(allowed_classes)
    if api_key:
        keys[api_key.strip()] = classes
    return keys, (classes if not keys else None)
