"""The plugin's shared-state lock file is never opened through a symlink."""

from __future__ import annotations

from pathlib import Path

import pytest

from horizonserve.runtime.engine.vllm_omni.shared import _attach


def _missing(path: Path) -> str:
    raise FileNotFoundError(path)


def test_lock_file_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("keep me")
    state = tmp_path / "shm" / "record"
    state.parent.mkdir()
    (state.parent / "record.lock").symlink_to(target)
    with pytest.raises(OSError, match=r"record\.lock: cannot open the lock file"):
        _attach(state, _missing, lambda p: "created", ())
    assert target.read_text() == "keep me"


def test_lock_file_is_created_when_missing(tmp_path: Path) -> None:
    state = tmp_path / "shm" / "record"
    assert _attach(state, _missing, lambda p: "created", ()) == "created"
    assert (state.parent / "record.lock").is_file()
