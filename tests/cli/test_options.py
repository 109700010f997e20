"""The options several commands share mean the same in every command (`ballast/options.py`):
each command's help for them starts with the shared meaning, and takes the shared type."""
from __future__ import annotations

import argparse

import pytest

from ballast.cli import COMMANDS
from ballast.command_line.options import SHARED


def command_options() -> list[tuple[str, str, argparse.Action]]:
    found = []
    for name, module in COMMANDS.items():
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        found += [(name, flag, action) for action in parser._actions for flag in action.option_strings
                  if flag in SHARED]
    return found


def test_every_command_that_takes_a_shared_option_gives_it_the_shared_meaning():
    found = command_options()
    seen = {(name, flag) for name, flag, _ in found}
    # every command takes --model and --world; --max-len all but none; the rest where they apply
    assert {(c, f) for c in COMMANDS for f in ("--model", "--world")} <= seen
    assert {(c, "--max-len") for c in COMMANDS} <= seen
    assert {(c, "--device-memory-gb") for c in COMMANDS} <= seen
    for name, flag, action in found:
        assert action.help.startswith(SHARED[flag].meaning), (name, flag, action.help)
        assert "(default: " in action.help, (name, flag)


@pytest.mark.parametrize("command", ["simulate", "verify", "profile", "bench"])
def test_a_shared_option_takes_the_shared_type(command):
    parser = argparse.ArgumentParser()
    COMMANDS[command].add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-len", "0"])
    assert parser.parse_args(["--max-len", "64"]).max_len == 64


def parser_of(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    COMMANDS[command].add_arguments(parser)
    return parser


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_numeric_option_is_range_checked_where_it_is_parsed(command):
    """No option takes a bare int or float: each one's type refuses an infinity, a NaN and a value
    out of its range by name (`value_checks.Numbers`)."""
    for action in parser_of(command)._actions:
        assert action.type not in (int, float), (command, action.option_strings)


# The shared spellings of the planning options, and the commands that plan.
PLANNING = {"--routing": ("simulate", "train", "verify"), "--degree": ("simulate", "train", "verify", "bench"),
            "--cp": ("simulate", "train", "verify", "bench")}


@pytest.mark.parametrize("flag, commands", PLANNING.items())
def test_the_planning_options_are_spelled_and_explained_alike(flag, commands):
    for command in commands:
        actions = [a for a in parser_of(command)._actions if flag in a.option_strings]
        assert len(actions) == 1, (command, flag)
        assert actions[0].help.startswith(SHARED[flag].meaning), (command, flag)


@pytest.mark.parametrize("command", PLANNING["--routing"])
@pytest.mark.parametrize("argv, on", [([], True), (["--routing"], True), (["--no-routing"], False),
                                      (["--routing", "off"], False), (["--routing", "on"], True)])
def test_routing_is_one_switch_and_the_older_spelling_still_works(command, argv, on):
    parser = parser_of(command)
    dest = next(a.dest for a in parser._actions if "--routing" in a.option_strings)
    value = getattr(parser.parse_args(argv), dest, True)  # train leaves an absent flag to its config
    assert value is on


def test_a_switch_shows_as_both_its_spellings_in_help():
    from ballast.command_line.options import Formatter

    parser = argparse.ArgumentParser(formatter_class=Formatter)
    COMMANDS["simulate"].add_arguments(parser)
    assert "--routing, --no-routing" in parser.format_help()


def test_verify_keeps_routed_as_the_older_spelling_of_route_every_wave():
    assert parser_of("verify").parse_args(["--routed"]).route_every_wave is True


@pytest.mark.parametrize("command", ["verify", "profile", "bench", "train"])
def test_every_command_that_starts_ranks_takes_precision_as_one_typed_value(command):
    from ballast.vocabulary.precision import Precision

    parser = argparse.ArgumentParser()
    COMMANDS[command].add_arguments(parser)
    dest = next(a.dest for a in parser._actions if "--precision" in a.option_strings)
    assert getattr(parser.parse_args(["--precision", "bf16"]), dest) is Precision.BF16
    with pytest.raises(SystemExit):
        parser.parse_args(["--precision", "fp16"])


def test_precision_autocasts_bf16_on_cuda_only_when_auto():
    from ballast.vocabulary.precision import Precision

    assert [p.autocast("cuda") for p in Precision] == [True, True, False]
    assert [p.autocast("cpu") for p in Precision] == [False, True, False]
