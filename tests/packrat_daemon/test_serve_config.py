"""`packrat serve --config FILE`: TOML options, command-line flags win, unknown keys rejected."""

from __future__ import annotations

from pathlib import Path

import pytest

from packrat_daemon.cli import build_parser
from packrat_daemon.commands.serve import _serve_parser, apply_config_file, config_from
from packrat_daemon.wire.errors import ConfigError


def parse(*argv: str):  # noqa: ANN201
    args = build_parser().parse_args(["serve", *argv])
    args.argv = ["serve", *argv]
    defaults = {action.dest: action.default for action in _serve_parser()._actions}
    apply_config_file(args, defaults)
    return args


def test_config_fills_options_and_flags_win(tmp_path: Path) -> None:
    config = tmp_path / "m.toml"
    config.write_text('model = "builtin:tiny-mlp"\nmax_batch = 4\nbatches = "1,4"\npolicy = "single"\n')
    args = parse("--config", str(config), "--policy", "packrat")
    assert args.model == "builtin:tiny-mlp" and args.max_batch == 4 and args.batches == [1, 4]
    assert args.policy == "packrat"


def test_unknown_key_names_the_known_ones(tmp_path: Path) -> None:
    config = tmp_path / "m.toml"
    config.write_text("max_batchez = 4\n")
    with pytest.raises(ConfigError, match="unknown option 'max_batchez'.*max_batch"):
        parse("--config", str(config))


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("model = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse("--config", str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        parse("--config", str(tmp_path / "none.toml"))


def test_example_config_in_the_repository_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "systemd" / "example.toml"
    args = parse("--config", str(example))
    assert args.model == "builtin:resnet50" and args.policy == "packrat"
    config = config_from(args)
    assert (config.min_split_gain, config.split_check_rounds) == (0.05, 5)
    tuned = config_from(parse("--config", str(example), "--min-split-gain", "0.1", "--split-check-rounds", "0"))
    assert (tuned.min_split_gain, tuned.split_check_rounds) == (0.1, 0)  # flags win over the file
