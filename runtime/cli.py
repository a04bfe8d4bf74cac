"""`horizonserve` command line: one entry point, one module per subcommand.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
it is imported only when chosen, so `horizonserve bench` never pays for torch or kopf.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from horizonserve.runtime import __version__
from horizonserve.runtime.cli_types import describe_error

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("horizonserve.runtime.bench.cli", "run benchmarks (default: simulated policy sweep)"),
    "sim": ("horizonserve.runtime.sim.cli", "simulate a workload; `sim plan` for capacity"),
    "calibrate": ("horizonserve.runtime.calibrate.cli", "measure SLO table and SM ladder on a GPU"),
    "serve": ("horizonserve.runtime.engine.reference.cli", "run the reference stage pipeline"),
    "sidecar": ("horizonserve.runtime.sidecar", "calibration, /metrics and node summary sidecar"),
}


class OneLineParser(argparse.ArgumentParser):
    """A parser whose errors are one line (`prog: error: ... (see prog --help)`), exit code 2.

    Sub-parsers inherit the class, so every subcommand's mistakes read the same.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser; only the subcommand named in `argv` loads its module's arguments."""
    parser = OneLineParser(
        prog="horizonserve", description="SLO-aware serving of omni models on one GPU."
    )
    parser.add_argument("--version", action="version", version=f"horizonserve {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        if name == chosen:
            importlib.import_module(module_name).add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print(f"horizonserve {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"horizonserve {args.command}: error: {describe_error(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
