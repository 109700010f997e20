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
