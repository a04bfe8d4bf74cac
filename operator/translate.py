"""OmniService spec → the runtime's ServingConfig, with errors that name the field.

This is where the operator catches what the CRD schema cannot express: cross-field rules of
the runtime models (ladder order and bounds, rotation range) and references into the chosen
pipeline (per-class SLO overrides must name classes the pipeline has). Every failure is a
`SpecError` whose `path` is the offending field (`spec.slo.classOverrides.foo`), which the
handlers put at the start of the `Ready=False` condition's message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from horizonserve.operator.models import OmniServiceSpec, camelise_message
from horizonserve.runtime.config import (
    PipelineSpec,
    ServingConfig,
    SloTable,
    default_ladder,
    load_pipeline,
)

PipelineLoader = Callable[[str], PipelineSpec]


class SpecError(ValueError):
    """An OmniService spec the operator cannot serve; `path` names the field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def field_path(loc: tuple[int | str, ...], root: str = "spec") -> str:
    """A pydantic error location as a Kubernetes field path: spec.tolerations[0].key."""
    out = root
    for part in loc:
        if isinstance(part, int) or "." in part or "/" in part:
            out += f"[{part}]"
        else:
            out += f".{part}"
    return out


_SUBFIELD = re.compile(r"^([a-z][A-Za-z0-9]*(?:\.[A-Za-z0-9_-]+)*): (.+)$", re.DOTALL)
UNKNOWN_FIELD = (
    "unknown field: the OmniService schema has no such field (fields are camelCase, e.g. "
    "nodeSelector; see `kubectl explain omniservice.spec`); remove or rename it"
)


def _first_error(exc: ValidationError, root: str) -> SpecError:
    errors = exc.errors(include_url=False)
    err = errors[0]
    path = field_path(tuple(err["loc"]), root)
    if err["type"] == "extra_forbidden":
        msg = UNKNOWN_FIELD
    else:
        msg = camelise_message(err["msg"].removeprefix("Value error, "))
        # A model-level rule names its field first ("levels: ..."): make it part of the path.
        sub = _SUBFIELD.match(msg)
        if sub is not None:
            path, msg = f"{path}.{sub.group(1)}", sub.group(2)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return SpecError(path, msg + more)


def parse_spec(spec: Mapping[str, Any]) -> OmniServiceSpec:
    """Validate a raw spec (camelCase) into the model; SpecError on the first bad field."""
    try:
        # Wire names only: a snake_case `node_selector` is an unknown field, not an alias.
        return OmniServiceSpec.model_validate(dict(spec), by_alias=True, by_name=False)
    except ValidationError as exc:
        raise _first_error(exc, "spec") from None


def slo_table(spec: OmniServiceSpec, pipeline: PipelineSpec) -> SloTable:
    """The pipeline's table with the spec's global multiplier and per-class overrides."""
    known = [c.name for c in pipeline.slo.classes]
    for name in spec.slo.class_overrides:
        if name not in known:
            raise SpecError(
                f"spec.slo.classOverrides.{name}",
                f"unknown request class {name!r} for pipeline {pipeline.name!r}; known: {known}",
            )
    classes = [
        c.model_copy(update={"slo_multiplier": spec.slo.class_overrides[c.name]})
        if c.name in spec.slo.class_overrides
        else c
        for c in pipeline.slo.classes
    ]
    raw = pipeline.slo.model_dump()
    raw.update(multiplier=spec.slo.multiplier, classes=[c.model_dump() for c in classes])
    try:
        return SloTable.model_validate(raw)
    except ValidationError as exc:
        raise _first_error(exc, "spec.slo") from None


def serving_config(spec: OmniServiceSpec, load: PipelineLoader = load_pipeline) -> ServingConfig:
    """The ServingConfig every serving pod of this OmniService receives."""
    name = spec.pipeline.value
    try:
        pipeline = load(name)
    except (ValueError, FileNotFoundError) as exc:
        raise SpecError("spec.pipeline", f"cannot load pipeline {name!r}: {exc}") from None
    ladder = spec.ladder.to_runtime() if spec.ladder is not None else default_ladder()
    try:
        return ServingConfig(
            model=spec.model or pipeline.model,
            pipeline=name,
            policy=spec.policy,
            slo=slo_table(spec, pipeline),
            ladder=ladder,
            control=spec.control.to_runtime(),
        )
    except ValidationError as exc:
        raise _first_error(exc, "spec") from None


def translate(
    raw_spec: Mapping[str, Any], load: PipelineLoader = load_pipeline
) -> tuple[OmniServiceSpec, ServingConfig]:
    """Parse and translate in one go; SpecError names the first field at fault."""
    spec = parse_spec(raw_spec)
    return spec, serving_config(spec, load)
