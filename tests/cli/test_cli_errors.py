"""Every user mistake on the command line: exit code 2, one line naming the option, no
traceback, and no work started (nothing printed on stdout, no output written)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from horizonserve.runtime.cli import build_parser, main


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`horizonserve ARGV` in-process: (exit code, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own exit
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(argv: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> str:
    t0 = time.perf_counter()
    code, out, err = run_cli(argv, capsys)
    took = time.perf_counter() - t0
    assert code == 2, (argv, code, out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert option in lines[0], lines[0]
    assert lines[0].startswith("horizonserve"), lines[0]
    assert out == "", out  # nothing ran
    assert took < 5.0, f"{argv} took {took:.1f} s before refusing"
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "option", "says"),
    [
        (["sim", "run", "--duration", "0"], "--duration", "> 0"),
        (["sim", "run", "--duration", "-5"], "--duration", "> 0"),
        (["sim", "run", "--duration", "nan"], "--duration", "finite"),
        (["sim", "run", "--rate", "inf"], "--rate", "finite"),
        (["sim", "run", "--rate", "0"], "--rate", "> 0"),
        (["sim", "run", "--long-ratio", "1.5"], "--long-ratio", "[0, 1]"),
        (["sim", "run", "--slo-multiplier", "0"], "--slo-multiplier", "> 0"),
        (["sim", "run", "--seed", "-1"], "--seed", ">= 0"),
        (["sim", "run", "--mix", "text-text=-1"], "--mix", ">= 0"),
        (["sim", "run", "--mix", "text-text=0"], "--mix", "weight > 0"),
        (["sim", "run", "--artifact", "/no/such/artifact.json"], "--artifact", "no file"),
        (["sim", "plan", "--requests", "0"], "--requests", ">= 1"),
        (["sim", "plan", "--target", "0"], "--target", "(0, 1]"),
        (["sim", "plan", "--target", "1.5"], "--target", "(0, 1]"),
        (["sim", "plan", "--tol", "0"], "--tol", "(0, 1)"),
        (["sim", "plan", "--jobs", "0"], "--jobs", ">= 1"),
        (["sim", "plan", "--systems", "horizon,nope"], "--systems", "unknown system nope"),
        (["sim", "plan", "--control", "nope=1"], "--control", "not a control knob"),
        (["sim", "run", "--control", "downstream_urgency"], "--control", "KEY=VALUE"),
        (["bench", "--duration", "0"], "--duration", "> 0"),
        (["bench", "--slo-multiplier", "0"], "--slo-multiplier", "> 0"),
        (["bench", "--rates", "2,0"], "--rates", "> 0"),
        (["bench", "--rates", ","], "--rates", "empty list"),
        (["bench", "--long-ratios", "0.2,1.5"], "--long-ratios", "[0, 1]"),
        (["bench", "--long-rate", "-1"], "--long-rate", "> 0"),
        (["bench", "--warmup", "-1"], "--warmup", ">= 0"),
        (["bench", "--jobs", "0"], "--jobs", ">= 1"),
        (["bench", "--systems", "horizon-no-ro"], "--systems", "unknown system"),
        (["bench", "--out", "/etc/passwd"], "--out", "is a file"),
        (["bench", "--out", "/etc/passwd/sub"], "--out", "is a file"),
        (["bench", "overhead", "--sizes", "-5"], "--sizes", ">= 1"),
        (["bench", "overhead", "--sizes", "16", "0"], "--sizes", ">= 1"),
        (["bench", "overhead", "--rounds", "0"], "--rounds", ">= 1"),
        (["bench", "--pipeline", "nope"], "--pipeline", "invalid choice"),
    ],
)
def test_option_refused_before_work(
    argv: list[str], option: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = assert_refused(argv, option, capsys)
    assert says in line, line


def test_json_into_a_missing_folder_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "missing" / "run.json"
    line = assert_refused(["sim", "run", "--json", str(target)], "--json", capsys)
    assert "does not exist" in line and "mkdir -p" in line
    assert not target.parent.exists()
    line = assert_refused(["sim", "run", "--json", str(tmp_path)], "--json", capsys)
    assert "is a folder" in line


def test_warmup_not_below_duration_is_refused_before_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["bench", "--duration", "10", "--warmup", "10", "--out", str(out)]
    line = assert_refused(argv, "--warmup", capsys)
    assert "below --duration" in line
    assert not out.exists()


def test_unknown_mix_class_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = assert_refused(["sim", "run", "--mix", "nope=1", "--duration", "5"], "mix", capsys)
    assert "unknown classes" in line and "text-text" in line


def test_invalid_artifact_is_one_line_without_pydantic_urls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "artifact.json"
    bad.write_text(json.dumps({"schema_version": 1}))
    for cmd in (["bench"], ["sim", "run"], ["sim", "plan"]):
        argv = [*cmd, "--artifact", str(bad)]
        line = assert_refused(argv, "--artifact", capsys)
        assert "not a valid calibration artifact" in line and "Field required" in line
        assert "https://" not in line
    bad.write_text("{not json")
    assert "not a valid" in assert_refused(["bench", "--artifact", str(bad)], "--artifact", capsys)


def test_sim_plan_and_bench_accept_pipeline_all() -> None:
    for argv in (["sim", "plan", "--pipeline", "all"], ["bench", "--pipeline", "all"]):
        args = build_parser(argv).parse_args(argv)
        assert args.pipeline == "all"


@pytest.mark.parametrize(
    "argv", [["--help"], ["bench", "--help"], ["sim", "run", "--help"], ["sim", "plan", "--help"]]
)
def test_help_exits_zero(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(argv, capsys)
    assert code == 0 and "usage:" in out


def test_console_script_refuses_without_traceback(tmp_path: Path) -> None:
    """The installed entry point, as a user runs it: one stderr line, exit 2, seconds."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "horizonserve.runtime.cli", "bench", "--out", "/etc/passwd"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "horizonserve bench: error: argument --out: /etc/passwd is a file, not a folder; "
        "give a folder path (see horizonserve bench --help)"
    ]
    assert time.perf_counter() - t0 < 30
