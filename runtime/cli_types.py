"""argparse value checks shared by the subcommands.

Every check runs while the command line is parsed, so a bad value stops the command before any
work starts. Each raises `argparse.ArgumentTypeError` with the problem and the fix; argparse
prefixes the option's name and `horizonserve`'s parser prints it as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

Check = Callable[[str], float]


def _number(text: str, integer: bool) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def bounded(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    unit: str = "",
) -> Check:
    """A finite number in [low, high] (open ends as told); e.g. `bounded(0, low_open=True)`."""
    lo_sym = "(" if low_open else "["
    hi_sym = ")" if high_open else "]"
    lo_txt = "-inf" if low is None else f"{low:g}"
    hi_txt = "inf" if high is None else f"{high:g}"
    span = f"in {lo_sym}{lo_txt}, {hi_txt}{hi_sym}"
    if low is not None and high is None:
        span = f"{'>' if low_open else '>='} {low:g}"
    what = ("a whole number " if integer else "a number ") + span + (f" {unit}" if unit else "")

    def check(text: str) -> float:
        v = _number(text, integer)
        too_low = low is not None and (v <= low if low_open else v < low)
        too_high = high is not None and (v >= high if high_open else v > high)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"got {text}; give {what}")
        return v

    check.__name__ = "number"  # argparse names the type in its own messages
    return check


positive = bounded(0.0, low_open=True)
non_negative = bounded(0.0)
positive_int = bounded(1, integer=True)
non_negative_int = bounded(0, integer=True)
fraction = bounded(0.0, 1.0)  # a share, 0–1
attainment = bounded(0.0, 1.0, low_open=True)  # a target attainment, (0, 1]


def number_list(each: Check) -> Callable[[str], tuple[float, ...]]:
    """Comma-separated numbers, each passing `each`; at least one."""

    def check(text: str) -> tuple[float, ...]:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError("empty list; give comma-separated numbers, e.g. 2,4")
        return tuple(each(p) for p in parts)

    check.__name__ = "list"
    return check


def _nearest_existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def output_dir(text: str) -> Path:
    """A folder that exists and is writable, or can be created (its nearest existing ancestor
    is a writable folder)."""
    p = Path(text).expanduser()
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{p} is a file, not a folder; give a folder path")
    base = _nearest_existing(p.absolute())
    if not base.is_dir():
        raise argparse.ArgumentTypeError(f"{base} is a file, so {p} cannot be a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {base}; choose a writable folder")
    return p


def output_file(text: str) -> Path:
    """A file path whose folder exists and is writable (an existing file must be writable)."""
    p = Path(text).expanduser()
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{p} is a folder; give a file name, e.g. {p}/out.json")
    parent = p.absolute().parent
    if not parent.exists():
        raise argparse.ArgumentTypeError(
            f"folder {parent} does not exist; create it (mkdir -p) or choose another path"
        )
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {p}; choose a writable path")
    return p


def input_file(text: str) -> str:
    """An existing, readable file (kept as the string the user gave)."""
    p = Path(text).expanduser()
    if not p.is_file():
        raise argparse.ArgumentTypeError(f"no file {p}; give the path of an existing file")
    if not os.access(p, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {p}")
    return str(p)


def one_of(choices: list[str] | tuple[str, ...], what: str) -> Callable[[str], tuple[str, ...]]:
    """Comma-separated names, each from `choices` (order kept, duplicates dropped)."""

    def check(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        bad = [n for n in names if n not in choices]
        if bad or not names:
            shown = ", ".join(bad) if bad else "none given"
            raise argparse.ArgumentTypeError(
                f"unknown {what} {shown}; choose from {', '.join(choices)}"
            )
        return names

    check.__name__ = "list"
    return check


def artifact_file(text: str) -> str:
    """A calibration artifact that exists and passes its schema (loaded once here, so a bad
    file is refused before any work)."""
    from horizonserve.runtime.artifact import NAMED_ARTIFACTS, load_artifact

    if text in NAMED_ARTIFACTS:  # a shipped artifact by name: fitted, measured, estimate
        return text
    path = input_file(text)
    try:
        load_artifact(path)
    except (ValueError, OSError) as exc:  # JSON and pydantic errors are ValueErrors
        raise argparse.ArgumentTypeError(
            f"{path} is not a valid calibration artifact ({describe_error(exc)}); give one "
            "written by horizonserve calibrate, or leave the option out"
        ) from None
    return path


def control_pair(text: str) -> tuple[str, str]:
    """`KEY=VALUE`: one control knob override (`ControlParams`), checked by name here and by
    value where it is applied."""
    from horizonserve.runtime.config import RETIRED_KNOBS, ControlParams

    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE, e.g. downstream_urgency=slack")
    if key in RETIRED_KNOBS:
        raise argparse.ArgumentTypeError(
            f"{key!r} is no longer a control knob; {RETIRED_KNOBS[key]}"
        )
    if key not in ControlParams.model_fields:
        raise argparse.ArgumentTypeError(
            f"{key!r} is not a control knob; one of: {', '.join(ControlParams.model_fields)}"
        )
    return key, value


def describe_error(exc: BaseException) -> str:
    """One line for a user-facing error: pydantic's field errors without their URLs, an
    OSError as "reason: path", anything else as its message."""
    errors = getattr(exc, "errors", None)
    if callable(errors) and exc.__class__.__name__ == "ValidationError":
        parts = []
        for e in errors():
            loc = ".".join(str(x) for x in e.get("loc", ())) or "value"
            parts.append(f"{loc}: {e.get('msg', 'invalid')}")
        return "; ".join(parts)
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return " ".join(str(exc).split())


def add_systems_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--systems`: comma-separated names from the one system registry (default: all)."""
    from horizonserve.runtime.sim.systems import SYSTEMS

    parser.add_argument(
        "--systems",
        type=one_of(list(SYSTEMS), "system"),
        default=tuple(SYSTEMS),
        help="comma-separated systems (default: all): " + ", ".join(SYSTEMS),
    )
