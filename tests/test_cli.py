"""The command line's conventions: `-v` anywhere, booleans, bind addresses, env names, deprecations."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys

import pytest

from dra_driver import cli, flags
from dra_driver.flags import BindAddress, parse_bind_address, parse_bool


@pytest.fixture
def verbosity(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The verbosity main() configures logging with (pytest owns the root logger's handlers)."""
    seen: list[int] = []
    monkeypatch.setattr(cli, "configure_logging", seen.append)
    monkeypatch.delenv("NODE_NAME", raising=False)
    return seen


DISCOVER = ["discover", "--profile", "t4", "--gpus", "1", "--node-name", "n1", "-o", "json"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (DISCOVER, 0),
        (["-v", *DISCOVER], 1),
        ([*DISCOVER, "-v"], 1),
        (["discover", "-vv", *DISCOVER[1:]], 2),
        (["-v", *DISCOVER, "--verbose"], 2),
    ],
)
def test_verbose_before_or_after_the_subcommand(
    verbosity: list[int], capsys: pytest.CaptureFixture[str], argv: list[str], expected: int
) -> None:
    assert cli.main(argv) == 0
    capsys.readouterr()
    assert verbosity == [expected]


def test_every_subcommand_takes_verbose_and_nested_counts_add_up() -> None:
    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subcommands.choices.items():
        assert "-v" in sub._option_string_actions and "--verbose" in sub._option_string_actions, name
    args = parser.parse_args(["-v", "cluster", "-v", "up", "-vv"])
    assert cli._verbosity(args) == 4 and args.verbose == 4
    assert not [name for name in vars(args) if name.startswith(cli.SUB_VERBOSE_PREFIX)]


@pytest.mark.parametrize("word", ["1", "t", "T", "true", "TRUE", "True", " true "])
def test_true_spellings(word: str) -> None:
    assert parse_bool(word) is True


@pytest.mark.parametrize("word", ["0", "f", "F", "false", "FALSE", "False"])
def test_false_spellings(word: str) -> None:
    assert parse_bool(word) is False


@pytest.mark.parametrize("word", ["", "yes", "no", "2", "on"])
def test_other_words_are_not_booleans(word: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected true or false"):
        parse_bool(word)


@pytest.mark.parametrize(
    ("text", "address", "shown"),
    [
        ("0", BindAddress("", 0), "0"),
        (":0", BindAddress("", 0), "0"),
        (":8080", BindAddress("", 8080), ":8080"),
        ("0.0.0.0:8080", BindAddress("0.0.0.0", 8080), "0.0.0.0:8080"),
        ("127.0.0.1:9400", BindAddress("127.0.0.1", 9400), "127.0.0.1:9400"),
        ("[::1]:8080", BindAddress("::1", 8080), "[::1]:8080"),
        ("[::]:8080", BindAddress("::", 8080), "[::]:8080"),
        (" 127.0.0.1:0 ", BindAddress("127.0.0.1", 0), "0"),
        ("localhost:65535", BindAddress("localhost", 65535), "localhost:65535"),
    ],
)
def test_bind_addresses(text: str, address: BindAddress, shown: str) -> None:
    assert parse_bind_address(text) == address
    assert str(address) == shown
    assert address.enabled == (address.port != 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("8080", "expected HOST:PORT"),
        ("host:", "expected HOST:PORT"),
        (":http", "expected HOST:PORT"),
        (":-1", "expected HOST:PORT"),
        (":65536", "within 0..65535"),
        ("::1:8080", "IPv6 host in brackets"),
        ("garbage", "expected HOST:PORT"),
        ("[::1]", "expected HOST:PORT"),
        ("foo bar:8080", "HOST must be an IP address or a host name"),
        ("300.1.1.1:8080", "HOST must be an IP address or a host name"),
        ("-dash:8080", "HOST must be an IP address or a host name"),
        ("[127.0.0.1]:8080", "only an IPv6 address goes in brackets"),
        ("[not-an-ip]:8080", "only an IPv6 address goes in brackets"),
    ],
)
def test_bad_bind_addresses(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_bind_address(text)


def test_environment_variables_are_named_after_their_flags() -> None:
    assert flags.env_name("--cdi-dir") == "CDI_DIR"
    assert flags.env_name("--metrics-bind-address") == "METRICS_BIND_ADDRESS"
    assert flags.env_name("--policy-taint") == "POLICY_TAINT"


def test_a_bad_value_from_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAG", "maybe")
    parser = argparse.ArgumentParser()
    flags.add_bool(parser, "--flag", default=False, help="a flag")
    with pytest.raises(argparse.ArgumentTypeError, match=r"got 'maybe' \(environment variable FLAG\)"):
        parse_bool(parser.get_default("flag"))


def test_a_deprecated_spelling_is_logged_once_per_process_naming_the_new_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(flags, "_warned", set())
    parser = argparse.ArgumentParser()
    flags.add_bool(parser, "--publish", default=True, env=False, negation_alias=True, help="publish")
    args = parser.parse_args(["--no-publish"])
    assert args.publish is False
    assert parser.parse_args(["--publish=false"]).publish is False
    assert parser.parse_args([]).publish is True
    assert not hasattr(parser.parse_args(["--publish=false"]), flags.FLAG_NOTES)
    with caplog.at_level(logging.WARNING, logger="dra_driver.cli"):
        flags.warn_deprecations(args)
        flags.warn_deprecations(parser.parse_args(["--no-publish"]))
    assert [r.getMessage() for r in caplog.records] == ["--no-publish is deprecated: use --publish=false"]
    assert caplog.records[0].levelno == logging.WARNING


@pytest.mark.parametrize(("flag", "level"), [([], "WARNING"), (["-v"], "INFO"), (["-vv"], "DEBUG")])
def test_verbose_after_the_subcommand_sets_the_log_level(flag: list[str], level: str) -> None:
    code = (
        "import logging, sys; from dra_driver.cli import main; "
        "main(sys.argv[1:]); print(logging.getLevelName(logging.getLogger().level), file=sys.stderr)"
    )
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    run = subprocess.run(
        [sys.executable, "-c", code, *DISCOVER, *flag],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert run.stderr.strip().splitlines()[-1] == level
