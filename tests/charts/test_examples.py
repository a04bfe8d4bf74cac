"""manifests/examples: one OmniService per pipeline, valid against the generated CRD schema
(what `kubectl apply` checks) and the operator's models (what the operator then accepts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from .chartlib import EXAMPLES, PIPELINES, crd_errors, require_generated_crd

EXAMPLE_FILES = {p: EXAMPLES / f"{p}.yaml" for p in PIPELINES}


def load_example(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(docs) == 1, f"{path.name}: one OmniService per file"
    return docs[0]


def test_one_example_per_pipeline() -> None:
    # Besides: <pipeline>-<model source>.yaml, checked in tests/operator/test_model_source.py.
    plain = sorted(p.name for p in EXAMPLES.glob("*.yaml") if "-" not in p.stem)
    assert plain == sorted(f"{p}.yaml" for p in PIPELINES)
    examples = {p: load_example(f) for p, f in EXAMPLE_FILES.items()}
    for pipeline, obj in examples.items():
        assert obj["spec"]["pipeline"] == pipeline
        assert "namespace" not in obj["metadata"], "let `kubectl apply -n` choose"
    names = [o["metadata"]["name"] for o in examples.values()]
    assert len(set(names)) == len(names)
    # Applied together they must not ask for the same GPUs: one GPU per node, one pod each.
    pools = [tuple(sorted(o["spec"]["nodeSelector"].items())) for o in examples.values()]
    assert len(set(pools)) == len(pools) and all(pools)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_example_fits_the_generated_crd_schema(pipeline: str) -> None:
    crd = require_generated_crd()
    obj = load_example(EXAMPLE_FILES[pipeline])
    assert crd_errors(crd, obj) == []


def test_crd_schema_check_catches_mistakes() -> None:
    """The check above is not vacuous: typos, wrong types and out-of-range values fail."""
    crd = require_generated_crd()
    obj = load_example(EXAMPLE_FILES["qwen2_5_omni"])
    bad_spec = {
        **obj["spec"],
        "nodeSelecter": {"a": "b"},
        "pipeline": "gpt4o",
        "slo": {"multiplier": 0},
        "shmSize": "lots",
    }
    errs = "\n".join(crd_errors(crd, {**obj, "spec": bad_spec}))
    for field in ("spec.pipeline", "spec.slo.multiplier", "spec.shmSize"):
        assert field in errs, errs
    # Unknown fields are kept by the schema (not pruned) and refused by the webhook.
    from horizonserve.operator.webhook import refusal

    typo = {**obj["spec"], "nodeSelecter": {"a": "b"}}
    assert (refusal(typo, "img:1") or "").startswith("spec.nodeSelecter: unknown field")
    assert crd_errors(crd, {**obj, "apiVersion": "horizonserve.io/v1"})
    assert crd_errors(crd, {**obj, "metadata": {"name": "Not_A_Name"}})


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_example_is_accepted_by_the_operator(pipeline: str) -> None:
    """The operator's own parsing and translation into the runtime config succeed, so the
    OmniService would not end up Ready=False for a spec error."""
    from horizonserve.operator.models import OmniService
    from horizonserve.operator.translate import translate

    obj = load_example(EXAMPLE_FILES[pipeline])
    OmniService.model_validate(obj)
    spec, config = translate(obj["spec"])
    assert config.pipeline == pipeline
    assert spec.node_selector == obj["spec"]["nodeSelector"]
