"""`ballast` command line: one subcommand per job; each lives in its own folder's `command.py`.

Errors end a command once, as one message: a user error (a ValueError, raised here or on any
rank, or a flag argparse refuses) with the one line `ballast <command>: error: ...` and exit 2; a defect on a rank with that rank's
traceback and exit 1. A rank that stopped because a peer failed (`PeerFailed`, or under torchrun
a collective the peer's death broke) prints nothing: the peer prints its own error. Under torchrun a
user error raised before the ranks joined the job (flags, config, files: the same on every rank)
is printed by each node's local rank 0 alone.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from .bench import command as bench
from .command_line.options import Formatter
from .profile import command as profile
from .runtime.world import PeerFailed, RankFailed, is_echo, under_torchrun, world_timeout
from .simulate import command as simulate
from .train import command as train
from .verify import command as verify

DESCRIPTION = "data-centric parallelism for training Transformers on variable-length sequences"
LOCAL_RANK0_GRACE_SECONDS = 30.0
"""How long a node's other ranks wait for local rank 0 to report a user error they all met."""
COMMANDS = {"simulate": simulate, "verify": verify, "train": train, "profile": profile, "bench": bench}


class Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line, as every other error of a command is
    (argparse prints its whole usage block first); `--help` still shows the usage."""

    def error(self, message: str):
        if _left_to_local_rank0():
            self.exit(2)
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def _left_to_local_rank0() -> bool:
    """Whether this process leaves a user error met before the ranks joined the job (flags,
    config, files: the same on every rank) for its node's local rank 0 to print: under torchrun,
    on every other local rank. It waits first: torchrun stops a node's ranks as soon as one
    exits, and leaving first could stop local rank 0 before it says the error."""
    if not under_torchrun() or world_timeout() is not None or os.environ.get("LOCAL_RANK", "0") == "0":
        return False
    time.sleep(LOCAL_RANK0_GRACE_SECONDS)
    return True


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """`ballast` and its subcommands, each with its command's options (the subcommands' parsers
    by name beside it)."""
    parser = Parser(prog="ballast", description=DESCRIPTION, formatter_class=Formatter)
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {}
    for name, module in COMMANDS.items():
        commands[name] = sub.add_parser(name, help=module.HELP, description=module.__doc__, formatter_class=Formatter)
        module.add_arguments(commands[name])
    return parser, commands


def main(argv: list[str] | None = None) -> int:
    parser, commands = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # said by the command's parser, which names the command
            commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as e:  # a usage error, said in one line (`Parser.error`), or --help
        return e.code if isinstance(e.code, int) else 2
    try:
        return COMMANDS[args.command].run(args)
    except PeerFailed as e:
        return 2 if e.user_error else 1
    except ValueError as e:
        # User errors (bad input, a plan that cannot exist) end with their message, not a trace.
        where = f"rank {os.environ['RANK']}: " if under_torchrun() else ""
        if under_torchrun() and world_timeout() is None:
            # Raised before joining the job: every rank checked the same flags and files and
            # failed alike, so one line per node says it (torchrun then reports the exit code).
            if _left_to_local_rank0():
                return 2
            where = ""
        print(f"ballast {args.command}: error: {where}{e}", file=sys.stderr)
        return 2
    except RankFailed as e:
        print(f"ballast {args.command}: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        if under_torchrun() and is_echo(e):  # a peer's failure broke this rank's collective
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
