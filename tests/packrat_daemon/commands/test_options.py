"""The command line's side of the settings table: option types and their messages, flags as the table declares
them (switches that are on by default turn off with --no-), typed-only parsing for config files, and the
parts every command shares. Flags against the TOML file and reloads are in test_config.py."""

from __future__ import annotations

import argparse

import pytest

from packrat_daemon.commands.options import (
    add_client_options,
    add_command,
    add_settings,
    int_list,
    positive_int,
    typed_settings,
)
from packrat_daemon.config import BY_NAME


def test_a_positive_integer_and_its_message() -> None:
    assert positive_int("8") == 8
    for text in ("0", "-2", "eight", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"expected a positive integer, got '{text}'"):
            positive_int(text)


def test_a_list_of_sizes_takes_singles_and_ranges_sorted_once_each() -> None:
    assert int_list("8-10,1,2,9") == [1, 2, 8, 9, 10]
    for text in ("0", "a", "4-x"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected positive integers"):
            int_list(text)


def parser_with(*names: str, typed_only: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_settings(parser, names, typed_only=typed_only)
    return parser


def test_flags_carry_the_tables_defaults_and_a_default_on_switch_turns_off_with_no() -> None:
    parser = parser_with("max_batch", "adapt", "batches")
    defaults = parser.parse_args([])
    assert (defaults.max_batch, defaults.adapt, defaults.batches) == (
        BY_NAME["max_batch"].default, True, BY_NAME["batches"].default
    )  # fmt: skip
    typed = parser.parse_args(["--max-batch", "4", "--no-adapt", "--batches", "1-4"])
    assert (typed.max_batch, typed.adapt, typed.batches) == (4, False, [1, 2, 3, 4])
    with pytest.raises(SystemExit):
        parser.parse_args(["--adapt"])  # on already: only its --no- form exists


def test_a_parsed_default_is_not_the_tables_own_object() -> None:
    parser_with("batches").parse_args([]).batches.append(3)
    assert BY_NAME["batches"].default == []


def test_typed_only_leaves_out_what_was_not_typed() -> None:
    parser = parser_with("max_batch", "adapt", typed_only=True)
    parser.add_argument("--config")
    assert typed_settings(parser.parse_args(["--config", "x.toml"])) == {}
    assert typed_settings(parser.parse_args(["--no-adapt", "--config", "x.toml"])) == {"adapt": False}


def test_the_help_shows_each_flags_default() -> None:
    parser = argparse.ArgumentParser()
    add_settings(parser)  # every setting: argparse %-formats each help, so a stray % would fail here
    text = " ".join(parser.format_help().split())
    assert f"{BY_NAME['max_batch'].help} (default: {BY_NAME['max_batch'].default})" in text
    assert "--no-adapt" in text and "turn this off:" in text


def test_a_command_says_its_summary_in_the_list_and_again_as_a_sentence_in_its_help() -> None:
    parser = argparse.ArgumentParser(prog="packrat")
    command = add_command(parser.add_subparsers(), "frob", "frob a running daemon", "See docs/frob.md.")
    assert command.description == "Frob a running daemon. See docs/frob.md."
    assert "frob a running daemon" in parser.format_help()


def test_a_client_command_takes_the_endpoint_and_the_curve_keys() -> None:
    parser = argparse.ArgumentParser()
    add_client_options(parser)
    args = parser.parse_args([])
    assert (args.endpoint, args.key, args.server_key) == (BY_NAME["endpoint"].default, None, None)
    args = parser.parse_args(["--endpoint", "ipc:///run/p.ipc", "--key", "c.key_secret", "--server-key", "s.key"])
    assert (args.endpoint, args.key, args.server_key) == ("ipc:///run/p.ipc", "c.key_secret", "s.key")
