"""Stage processes. `run_stage` is the spawn target: it imports the stage's module (and so torch)
only inside the child, so the front process stays free of torch."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
import time
from typing import Any

STAGE_MODULES = {
    "shared": "horizonserve.runtime.engine.reference.stages.shared",
    "speech": "horizonserve.runtime.engine.reference.stages.speech",
    "image": "horizonserve.runtime.engine.reference.stages.image",
    "code2wav": "horizonserve.runtime.engine.reference.stages.code2wav",
}
FLUSH_TIMEOUT_S = 5.0


def run_stage(name: str, cfg: Any, in_q: Any, events: Any, *extra: Any) -> None:
    """Process entry: `main(cfg, in_q, events, *extra)` of the named stage's module.

    A failure is reported as an ERROR event. On the way out the events still buffered are
    flushed (bounded wait: the front may be gone), hand-offs nobody will read are dropped, and
    the process leaves with `os._exit`, skipping torch's slow interpreter teardown.
    """
    code = 0
    try:
        importlib.import_module(STAGE_MODULES[name]).main(cfg, in_q, events, *extra)
    except BaseException as exc:
        code = 1
        logging.getLogger(__name__).exception("stage %s failed", name)
        with contextlib.suppress(Exception):
            events.put(_event("error", name, {"message": repr(exc)}))
            events.put(_event("stopped", name, {}))
    finally:
        for q in extra[0].values() if extra and isinstance(extra[0], dict) else ():
            q.cancel_join_thread()  # hand-offs to stages that already left
        events.close()
        flusher = threading.Thread(target=events.join_thread, daemon=True)
        flusher.start()
        flusher.join(FLUSH_TIMEOUT_S)
        logging.shutdown()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _event(kind: str, stage: str, data: dict[str, Any]) -> Any:
    from horizonserve.runtime.engine.reference.protocol import Event

    return Event(kind, stage, time.monotonic(), data=data)
