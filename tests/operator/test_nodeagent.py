"""The node agent: artifacts between the node's ConfigMap volume and the pod, then exec."""

from __future__ import annotations

from pathlib import Path

import pytest

from horizonserve.operator import nodeagent


def test_restore_copies_stored_artifacts_and_nothing_else(tmp_path: Path) -> None:
    stored, target = tmp_path / "stored", tmp_path / "artifacts"
    stored.mkdir()
    (stored / "artifact.qwen--NVIDIA_H200--570.json").write_text('{"a": 1}')
    (stored / "summary.json").write_text("{}")  # the summary is not an artifact
    (stored / "..data").mkdir()  # the kubelet's ConfigMap volume bookkeeping
    written = nodeagent.restore(stored, target)
    assert [p.name for p in written] == ["qwen--NVIDIA_H200--570.json"]
    assert (target / "qwen--NVIDIA_H200--570.json").read_text() == '{"a": 1}'
    assert nodeagent.restore(tmp_path / "absent", target) == []  # no ConfigMap yet: nothing


def test_artifacts_become_valid_configmap_keys_within_the_size(tmp_path: Path) -> None:
    (tmp_path / "qwen--NVIDIA H200--570.86.json").write_text("x" * 10)
    (tmp_path / "raw.log").write_text("not json")
    (tmp_path / "huge.json").write_text("y" * (nodeagent.MAX_UPLOAD_BYTES + 1))
    data = nodeagent.artifacts(tmp_path)
    assert data == {"artifact.qwen--NVIDIA_H200--570.86.json": "x" * 10}


def test_upload_failure_never_stops_the_sidecar(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a.json").write_text("{}")
    calls: list[list[str]] = []

    def refuse(*_a, **_k):
        raise RuntimeError("forbidden")

    monkeypatch.setattr(nodeagent, "upload", refuse)
    monkeypatch.setattr(nodeagent.os, "execvp", lambda f, argv: calls.append(argv))
    rc = nodeagent.main(
        ["upload", "--from", str(tmp_path), "--configmap", "cm", "--", "horizonserve", "sidecar"]
    )
    assert rc == 0 and calls == [["horizonserve", "sidecar"]]


def test_restore_then_exec(tmp_path: Path, monkeypatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(nodeagent.os, "execvp", lambda f, argv: calls.append(argv))
    argv = ["restore", "--from", str(tmp_path / "s"), "--to", str(tmp_path / "a"), "--",
            "horizonserve", "calibrate", "--mode", "auto"]  # fmt: skip
    assert nodeagent.main(argv) == 0
    assert calls == [["horizonserve", "calibrate", "--mode", "auto"]]
    with pytest.raises(SystemExit):
        nodeagent.main(["bogus"])
