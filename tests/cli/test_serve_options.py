"""`horizonserve serve`: every option's bad values are refused before anything starts (no
port bound, no stage spawned): exit code 2, one line naming the option, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_cli_errors import assert_refused

BAD: list[tuple[list[str], str]] = [
    (["--port", "-1"], "--port"),
    (["--port", "99999"], "--port"),
    (["--port", "http"], "--port"),
    (["--max-batch", "-3"], "--max-batch"),
    (["--max-batch", "0"], "--max-batch"),
    (["--max-len", "-5"], "--max-len"),
    (["--max-len", "1"], "--max-len"),
    (["--hang-timeout", "-1"], "--hang-timeout"),
    (["--hang-timeout", "nan"], "--hang-timeout"),
    (["--hang-timeout", "0"], "--hang-timeout"),
    (["--restart-backoff", "-1"], "--restart-backoff"),
    (["--restart-backoff", "inf"], "--restart-backoff"),
    (["--allowed-classes", "foo"], "--allowed-classes"),
    (["--allowed-classes", ","], "--allowed-classes"),
    (["--max-connections", "0"], "--max-connections"),
    (["--max-connections", "-1"], "--max-connections"),
    (["--max-connections-per-client", "0"], "--max-connections-per-client"),
    (["--max-connections", "8", "--max-connections-per-client", "9"], "--max-connections-per"),
    (["--backlog", "-5"], "--backlog"),
    (["--backlog", "0"], "--backlog"),
    (["--stats-interval", "-1"], "--stats-interval"),
    (["--stats-interval", "0"], "--stats-interval"),
    (["--stats-interval", "inf"], "--stats-interval"),
    (["--stats-file", "/"], "--stats-file"),
    (["--threads", "0"], "--threads"),
    (["--seed", "-1"], "--seed"),
    (["--preset", "huge"], "--preset"),
    (["--policy", "nope"], "--policy"),
    (["--device", "tpu"], "--device"),
    (["--downstream", "speech,foo"], "--downstream"),
    (["--host", "no such host.invalid"], "--host"),
    (["--api-key", " "], "--api-key"),
    (["--api-key", "a b"], "--api-key"),
    (["--api-key-file", "/no/such/keys"], "--api-key-file"),
    (["--config", "/no/such/config.json"], "--config"),
    (["--served-model-name", " "], "--served-model-name"),
]


@pytest.mark.parametrize(("extra", "option"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_serve_option_is_one_line_before_anything_starts(
    extra: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_refused(["serve", "--device", "cpu", "--port", "0", *extra], option, capsys)


def test_an_invalid_config_and_an_empty_key_file_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.json"
    config.write_text('{"model": "m"}')
    assert_refused(["serve", "--device", "cpu", "--config", str(config)], "--config", capsys)
    keys = tmp_path / "keys"
    keys.write_text("# nothing\n")
    assert_refused(
        ["serve", "--device", "cpu", "--api-key-file", str(keys)], "--api-key-file", capsys
    )


def test_a_blank_key_in_the_environment_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HORIZONSERVE_API_KEY", "\xa0")
    assert_refused(["serve", "--device", "cpu"], "HORIZONSERVE_API_KEY", capsys)
