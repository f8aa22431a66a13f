"""The settings table: `serve` flags, TOML checks, the ServeConfig built from both, and the docs made from it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from packrat_daemon.cli import build_parser
from packrat_daemon.commands.serve import config_loader
from packrat_daemon.config import MIN_ADAPT_GAIN, RESTART_ONLY, SETTINGS, ServeConfig
from packrat_daemon.settings import SWITCH, TEXT, Setting, markdown, restart_sentence, typed_module
from packrat_daemon.wire.errors import ConfigError
from policies.packrat import MIN_SPLIT_GAIN

REPO = Path(__file__).resolve().parents[2]

# A value other than the default for every setting, as TOML would hold it.
SAMPLE: dict[str, Any] = {
    "model": "builtin:tiny-mlp",
    "repository": "/srv/models",
    "input": "float32:16",
    "runtime": "onnxruntime",
    "emulate_cores": 16,
    "emulate_interference": "none",
    "precision": "bf16",
    "first_answer": "off",
    "max_rel_error": 0.01,
    "calibration": "calibration.npy",
    "accuracy_top1": "off",
    "allocator": "jemalloc",
    "emulate_measure": True,
    "endpoint": "ipc:///tmp/packrat-test.ipc",
    "server_key": "server.key_secret",
    "allowed_clients": "clients",
    "insecure_public": True,
    "max_batch": 8,
    "max_delay_ms": 2.5,
    "max_batch_tokens": 512,
    "length_batching": "pad-batch",
    "max_queue": 64,
    "run_dir": "/tmp/packrat-run",
    "control": "tcp://127.0.0.1:7001",
    "policy": "fixed",
    "plan": "2*1x8",
    "cpus": "0",
    "profile": "profile.csv",
    "save_profile": "saved.csv",
    "batches": [1, 4],
    "min_split_gain": 0.1,
    "split_check_rounds": 0,
    "profile_budget": "300s",
    "state_dir": "/var/lib/packrat/test",
    "adapt": False,
    "adapt_interval_s": 2.0,
    "adapt_min_batches": 7,
    "adapt_cooldown_s": 0.0,
    "adapt_min_gain": 0.2,
    "job_timeout_s": 9.0,
    "slice_deadline_margin": 2.5,
    "slice_deadline_floor_ms": 50.0,
    "slice_spin_floor_ms": 40.0,
    "slice_hedge_margin": 2.0,
    "slice_hedge_floor_ms": 20.0,
    "drain_timeout_s": 4.0,
    "startup_timeout_s": 60.0,
    "metrics_port": 9464,
    "metrics_address": "0.0.0.0",
    "log_level": "debug",
    "log_format": "json",
    "http_port": 8000,
    "grpc_port": 8001,
    "oip_address": "0.0.0.0",
    "oip_model_name": "classifier",
    "oip_tls_cert": "/etc/packrat/tls.crt",
    "oip_tls_key": "/etc/packrat/tls.key",
    "oip_limits": "max_connections=2000,body_timeout_s=300",
    "oip_metrics_port": 9102,
}


def config(*argv: str) -> ServeConfig:
    return config_loader(build_parser().parse_args(["serve", *argv]))()


def toml_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.toml"
    path.write_text(text)
    return path


def as_toml(values: dict[str, Any]) -> str:
    def literal(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        return f'"{value}"' if isinstance(value, str) else str(value)

    return "".join(f"{key} = {literal(value)}\n" for key, value in values.items())


def as_flags(values: dict[str, Any]) -> list[str]:
    by_name = {setting.name: setting for setting in SETTINGS}
    argv: list[str] = []
    for key, value in values.items():
        setting = by_name[key]
        if setting.kind is SWITCH:
            argv += [setting.flag] if value != setting.default else []
        else:
            argv += [setting.flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return argv


def test_the_sample_sets_every_setting_to_something_else() -> None:
    assert list(SAMPLE) == [setting.name for setting in SETTINGS]
    defaults = ServeConfig()
    assert all(getattr(defaults, name) != value for name, value in SAMPLE.items())


def test_flags_and_toml_give_the_same_config(tmp_path: Path) -> None:
    from_flags = config(*as_flags(SAMPLE))
    from_file = config("--config", str(toml_file(tmp_path, as_toml(SAMPLE))))
    assert from_flags == from_file == ServeConfig(**SAMPLE)


def test_config_fills_settings_and_flags_win(tmp_path: Path) -> None:
    path = toml_file(tmp_path, 'model = "builtin:tiny-mlp"\nmax_batch = 4\nbatches = "1,4"\npolicy = "single"\n')
    loaded = config("--config", str(path), "--policy", "packrat", "--max-delay-ms", "0")
    assert (loaded.model, loaded.max_batch, loaded.batches) == ("builtin:tiny-mlp", 4, [1, 4])
    assert (loaded.policy, loaded.max_delay_ms) == ("packrat", 0.0)
    assert loaded.max_queue == ServeConfig().max_queue  # neither in the file nor typed: the default


def test_the_three_timeouts_reach_the_config(tmp_path: Path) -> None:
    typed = config("--job-timeout-s", "7", "--drain-timeout-s", "3.5", "--startup-timeout-s", "90")
    assert (typed.job_timeout_s, typed.drain_timeout_s, typed.startup_timeout_s) == (7.0, 3.5, 90.0)
    path = toml_file(tmp_path, "job_timeout_s = 8\ndrain_timeout_s = 2.5\nstartup_timeout_s = 45.0\n")
    filed = config("--config", str(path))
    assert (filed.job_timeout_s, filed.drain_timeout_s, filed.startup_timeout_s) == (8.0, 2.5, 45.0)


@pytest.mark.parametrize(
    ("line", "allowed"),
    [
        ("max_batch = -3", "a positive integer"),
        ("max_batch = 2.5", "a positive integer"),
        ("max_batch = true", "a positive integer"),
        ('max_delay_ms = "soon"', "a number, 0 or more"),
        ("max_delay_ms = nan", "a number, 0 or more"),
        ("job_timeout_s = 0", "a number of seconds above 0"),
        ("min_split_gain = 1.5", "a fraction"),
        ("split_check_rounds = -1", "an integer, 0 or more"),
        ("metrics_port = 70000", "a port number"),
        ('batches = "1,x"', "positive integers"),
        ("batches = [0, 4]", "positive integers"),
        ('batches = ["4"]', "positive integers"),
        ('allocator = "mimalloc"', "one of system, jemalloc, tcmalloc"),
        ('log_level = "loud"', "one of debug, info, warning, error"),
        ('adapt = "yes"', "true or false"),
        ("model = 3", "a string"),
        ("profile = []", "a string"),
    ],
)
def test_a_bad_value_names_key_value_and_what_is_allowed(tmp_path: Path, line: str, allowed: str) -> None:
    path = toml_file(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as raised:
        config("--config", str(path))
    message = str(raised.value)
    assert str(path) in message and line in message and "expected " + allowed in message


@pytest.mark.parametrize(("flag", "text"), [("--max-batch", "-3"), ("--min-split-gain", "2"), ("--batches", "0")])
def test_a_bad_flag_is_refused_by_the_same_rule(capsys: pytest.CaptureFixture[str], flag: str, text: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", flag, text])
    assert f"argument {flag}: expected " in capsys.readouterr().err


def test_a_misspelt_key_gets_a_did_you_mean_not_the_whole_list(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown option 'max_batchez'; did you mean 'max_batch'") as caught:
        config("--config", str(toml_file(tmp_path, "max_batchez = 4\n")))
    assert "min_split_gain" not in str(caught.value)  # the close names only, not every option


def test_a_dashed_key_is_told_its_underscored_spelling(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown option 'max-batch'; TOML spells it 'max_batch', with underscores"):
        config("--config", str(toml_file(tmp_path, "max-batch = 4\n")))


def test_a_key_close_to_nothing_is_pointed_at_the_documented_list(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown option 'zzz'; no option is close to it.*docs/configuration.md"):
        config("--config", str(toml_file(tmp_path, "zzz = 4\n")))


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        config("--config", str(toml_file(tmp_path, "model = \n")))
    with pytest.raises(ConfigError, match="does not exist"):
        config("--config", str(tmp_path / "none.toml"))


def test_reload_rereads_the_file_through_the_same_checks(tmp_path: Path) -> None:
    path = toml_file(tmp_path, "max_batch = 8\n")
    load = config_loader(build_parser().parse_args(["serve", "--config", str(path), "--max-delay-ms", "3"]))
    assert (load().max_batch, load().max_delay_ms) == (8, 3.0)
    path.write_text("max_batch = -3\n")
    with pytest.raises(ConfigError, match="max_batch = -3"):
        load()
    path.write_text("max_batch = 4\nmax_delay_ms = 9\n")
    assert (load().max_batch, load().max_delay_ms) == (4, 3.0)  # the typed flag still wins


def test_example_config_in_the_repository_is_valid() -> None:
    example = str(REPO / "systemd" / "example.toml")
    loaded = config("--config", example)
    assert (loaded.model, loaded.policy, loaded.batches) == ("builtin:resnet50", "packrat", [1, 4, 8, 16])
    assert (loaded.min_split_gain, loaded.split_check_rounds) == (0.05, 5)
    assert (loaded.startup_timeout_s, loaded.drain_timeout_s, loaded.metrics_port) == (600.0, 30.0, 9464)
    tuned = config("--config", example, "--min-split-gain", "0.1", "--split-check-rounds", "0")
    assert (tuned.min_split_gain, tuned.split_check_rounds) == (0.1, 0)  # flags win over the file


def test_help_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    shown = capsys.readouterr().out
    assert [setting.flag for setting in SETTINGS if setting.flag not in shown] == []


def test_docs_match_the_table() -> None:
    written = (REPO / "docs" / "configuration.md").read_text()
    assert written == markdown(SETTINGS), "regenerate: python -m packrat_daemon.config > docs/configuration.md"
    assert all(f"`{setting.name}`" in written for setting in SETTINGS)


def test_the_typed_config_matches_the_table() -> None:
    """ServeConfig is generated from the table as a plain dataclass: the type checker sees each setting and its type."""
    written = (REPO / "packrat_daemon" / "serve_config.py").read_text()
    regenerate = "regenerate: python -m packrat_daemon.config --typed > packrat_daemon/serve_config.py"
    assert written == typed_module(SETTINGS), regenerate
    fields = {field.name: field for field in dataclasses.fields(ServeConfig)}
    assert list(fields) == [setting.name for setting in SETTINGS]
    assert all(ServeConfig().__dict__[s.name] == s.default for s in SETTINGS)
    assert ServeConfig().batches is not ServeConfig().batches  # a list default is each config's own


@pytest.mark.slow  # a mypy run: about 2 s
def test_the_type_checker_refuses_a_misspelt_setting(tmp_path: Path) -> None:
    from packrat_daemon import serve_config

    assert ServeConfig is serve_config.ServeConfig  # what every module imports from packrat_daemon.config
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from packrat_daemon.serve_config import ServeConfig\n\n\n"
        "def delay(config: ServeConfig) -> float:\n    return config.max_delay_ms + config.max_dealy_ms\n"
    )
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(probe)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert checked.returncode == 1 and 'has no attribute "max_dealy_ms"' in checked.stdout, checked.stdout
    assert "Found 1 error" in checked.stdout, "the right spelling is typed, as a float"


def test_one_declaration_gives_the_restart_list_the_docs_and_the_readme() -> None:
    assert tuple(s.name for s in SETTINGS if s.reload == "restart") == RESTART_ONLY
    assert {"model", "endpoint", "split_check_rounds"} <= set(RESTART_ONLY) and "max_delay_ms" not in RESTART_ONLY
    sentence = restart_sentence(SETTINGS)
    named = {s.name for s in SETTINGS if f"`{s.name}`" in sentence}
    assert named == set(RESTART_ONLY) | {"max_batch", "profile"}  # the two live ones with a limit, in its note
    flat = " ".join(sentence.split())
    assert flat in " ".join(markdown(SETTINGS).split())
    readme = " ".join((REPO / "README.md").read_text().split())  # the README wraps it at its own width
    assert flat in readme, "README.md: quote `python -m packrat_daemon.config --restart-sentence`"
    printed = subprocess.run(
        [sys.executable, "-m", "packrat_daemon.config", "--restart-sentence"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert printed.stdout == sentence + "\n"


def test_a_setting_must_say_what_a_reload_does_with_it() -> None:
    with pytest.raises(TypeError, match="reload"):
        Setting("x", TEXT, "", "help")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="reload must be one of live, restart"):
        Setting("x", TEXT, "", "help", reload="later")  # type: ignore[arg-type]


def test_gain_defaults_have_one_home_each() -> None:
    assert ServeConfig().min_split_gain == MIN_SPLIT_GAIN and ServeConfig().adapt_min_gain == MIN_ADAPT_GAIN
    solve = build_parser().parse_args(["solve", "--profile", "p.csv", "--batch", "8"])
    assert solve.min_split_gain == MIN_SPLIT_GAIN
