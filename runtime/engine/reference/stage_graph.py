"""Which stages a pipeline runs and how work flows between them.

Pure data and functions, no state: `DOWNSTREAM_STAGES` fixes each downstream stage's slot in
the control record (its index), `CHAINS` the stages a long-path request passes in order and
`FEEDS` who hands work on to whom. Everything else in the pipeline derives its stage order
from these three tables.
"""

from __future__ import annotations

from horizonserve.runtime.config import Path, Priority, RequestClass
from horizonserve.runtime.engine.reference.protocol import CODE2WAV, IMAGE, SPEECH

# Upstream first; a stage's index here is its control-record slot.
DOWNSTREAM_STAGES = (SPEECH, IMAGE, CODE2WAV)
# The downstream stages a long-path request passes, in order (speech: talker, then vocoder).
CHAINS: dict[str, tuple[str, ...]] = {SPEECH: (SPEECH, CODE2WAV), IMAGE: (IMAGE,)}
# Who hands work on to whom (the shared stage: Handoff; the talker: CodeChunk).
FEEDS: dict[str, tuple[str, ...]] = {"shared": (SPEECH, IMAGE), SPEECH: (CODE2WAV,)}


def downstream_of(cls: RequestClass) -> str | None:
    """The downstream path a class's requests take, named by its first stage (None: short
    path)."""
    if cls.path is not Path.LONG:
        return None
    return SPEECH if cls.priority is Priority.AUDIO else IMAGE


def stages_of(downstream: str | None) -> tuple[str, ...]:
    """Every stage a request on this downstream path needs, upstream first."""
    return ("shared", *CHAINS.get(downstream or "", ()))


def downstream_stages(names: tuple[str, ...]) -> tuple[str, ...]:
    """The downstream stages to run for `names`, each path's whole chain (speech: code2wav
    too), in `DOWNSTREAM_STAGES` order; ValueError for an unknown name or a stage without the
    one that feeds it."""
    for name in names:
        if name not in DOWNSTREAM_STAGES:
            known = ", ".join(DOWNSTREAM_STAGES)
            raise ValueError(f"downstream: unknown stage {name!r}; use {known}")
    chosen = {s for name in names for s in CHAINS.get(name, (name,))}
    for name in chosen:
        feeders = [f for f, targets in FEEDS.items() if name in targets and f != "shared"]
        if feeders and not chosen.intersection(feeders):
            raise ValueError(f"downstream: {name} needs the {feeders[0]} stage that feeds it")
    return tuple(s for s in DOWNSTREAM_STAGES if s in chosen)
