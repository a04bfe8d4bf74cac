"""docs/control.md is what `runtime.control_doc.render()` makes of the control models' field
descriptions; regenerate it with `python -m horizonserve.runtime.control_doc > docs/control.md`."""

from __future__ import annotations

from pathlib import Path

from horizonserve.runtime.config import RETIRED_KNOBS, ControlParams, PolicyName
from horizonserve.runtime.control_doc import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "control.md"


def test_control_doc_is_current() -> None:
    assert DOC.read_text() == render(), (
        "docs/control.md is stale: run `python -m horizonserve.runtime.control_doc > "
        "docs/control.md` and commit it"
    )


def test_every_field_policy_and_retired_name_is_documented() -> None:
    text = render()
    for name in ControlParams.model_fields:
        assert f"| `{name}` |" in text, name
    for policy in PolicyName:
        assert f"| `{policy.value}` |" in text, policy
    for old in RETIRED_KNOBS:
        assert f"| `{old}` |" in text, old
