"""Fixtures for tests against the real vLLM / vLLM-Omni schedulers (CPU, no download).

Install the pinned CPU set first: `bash .ci/install-vllm.sh .venv`. Without it every test here
skips with that hint. Test modules carry `pytestmark = pytest.mark.vllm`.

There is deliberately no `__init__.py` in this folder: a package named `vllm` under tests/ could
shadow the real distribution. For the same reason the skip check imports deep modules, not the
bare `vllm` name (which a stray namespace folder would satisfy).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from factory import SchedulerParams, require_vllm, write_tiny_model_dir
from factory import make_scheduler as _make_scheduler


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local directory holding only a tiny Qwen2 config.json (no weights, no tokenizer)."""
    require_vllm()
    return write_tiny_model_dir(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture
def make_scheduler(tiny_model_dir: Path) -> Callable[..., Any]:
    """`make_scheduler(kind="omni_ar", **SchedulerParams fields, scheduler_cls=None)`."""

    def build(kind: str = "omni_ar", *, scheduler_cls: type | None = None, **params: Any) -> Any:
        return _make_scheduler(
            kind, tiny_model_dir, SchedulerParams(**params), scheduler_cls=scheduler_cls
        )

    return build
