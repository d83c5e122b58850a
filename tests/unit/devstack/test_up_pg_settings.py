"""`gpupool up --pg-setting NAME=VALUE`: parsed strictly, so a typo fails before any server starts."""

from __future__ import annotations

import pytest

from libs.cli.main import build_parser, parse_pg_settings


def test_settings_are_parsed_and_a_later_one_wins() -> None:
    assert parse_pg_settings(["shared_preload_libraries=pg_stat_statements", "work_mem=8MB", "work_mem=16MB",
                              "pg_stat_statements.track=all"]) == {
        "shared_preload_libraries": "pg_stat_statements", "work_mem": "16MB", "pg_stat_statements.track": "all"}


@pytest.mark.parametrize("bad", ["work_mem", "=8MB", "work mem=8MB", "a;b=1"])
def test_a_malformed_setting_is_refused_with_its_text(bad: str) -> None:
    with pytest.raises(SystemExit, match="--pg-setting expects NAME=VALUE"):
        parse_pg_settings([bad])


def test_up_takes_the_option_repeatedly() -> None:
    args = build_parser().parse_args(["up", "--pg-setting", "a=1", "--pg-setting", "b=2"])
    assert args.pg_setting == ["a=1", "b=2"]
