"""Flag and help consistency across the rankscope commands, through the
real argument parsers (rankscope.cli.build_parser) and the real subcommand mains."""

from __future__ import annotations

import json

import pytest
from tests.daemon.test_daemon_flightstate import mark, rank_recorder

from rankscope import cli
from rankscope.rank.writer import ENV_DIR


def parse(argv: list[str]):
    return cli.build_parser(argv).parse_args(argv)


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        parse([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(("text", "seconds"), [("15", 15.0), ("15s", 15.0), ("1m30s", 90.0)])
def test_demo_duration_takes_units_like_the_daemon(text: str, seconds: float) -> None:
    assert parse(["demo", "--duration", text]).duration == seconds


def test_serve_names_its_flight_directory_as_a_dotted_flag(capsys) -> None:
    assert parse(["serve", "--flight.dir", "/x"]).flight_dir == "/x"
    assert parse(["serve", "--flight-dir", "/y"]).flight_dir == "/y"  # the old spelling stays
    text = help_text(["serve"], capsys)
    assert "--flight.dir DIR" in text
    assert "--log.level {debug,info,warning,error} log only messages" in text


def test_a_bad_floor_says_its_value_once_and_a_negative_one_reaches_its_parser(capsys) -> None:
    for argv in (["--corridor.floor", "150%"], ["--corridor.floor", "-2GiB"]):
        with pytest.raises(SystemExit):
            parse(["serve", *argv])
        err = capsys.readouterr().err
        assert err.count(repr(argv[1])) == 1, err
        assert "expected one argument" not in err


def test_census_help_states_its_exit_statuses(capsys) -> None:
    text = " ".join(help_text(["census"], capsys).split())
    assert "1 when the ranks diverge or a rank is stalled or dead" in text
    assert "2 on a usage error or when the directory holds no record" in text


def test_census_on_an_empty_directory_says_so_and_exits_2(tmp_path, capsys) -> None:
    assert cli.main(["census", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"no boots recorded in {tmp_path}" in captured.err


def test_the_top_level_help_is_for_users(capsys) -> None:
    text = help_text([], capsys)
    assert "where every byte of VRAM went" in text
    assert "imported only" not in text and "never pays for torch" not in text


@pytest.mark.parametrize("command", ["boots", "phases", "census", "oom"])
def test_readers_take_rankscope_dir_when_dir_is_left_out(
    command: str, flight_dir, monkeypatch, capsys
) -> None:
    rank_recorder(flight_dir, "boot-env", 0).write_record(mark("pre_weight_load"))
    monkeypatch.setenv(ENV_DIR, str(flight_dir))
    assert cli.main([command, "--json"]) == 0
    assert "boot-env" in json.dumps(json.loads(capsys.readouterr().out))
    monkeypatch.delenv(ENV_DIR)
    assert cli.main([command]) == 2
    assert ENV_DIR in capsys.readouterr().err


def test_boots_on_the_parent_of_a_flight_directory_points_at_it(tmp_path, capsys) -> None:
    flight = tmp_path / "flight"
    flight.mkdir()
    rank_recorder(flight, "boot-nested", 0).write_record(mark("pre_weight_load"))
    assert cli.main(["boots", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no boots recorded" in out and f"{flight}: try that directory" in out
