"""`ballast` command line: one subcommand per job; each lives in its own folder's `command.py`."""
from __future__ import annotations

import argparse
import sys

from .bench import command as bench
from .profile import command as profile
from .simulate import command as simulate
from .train import command as train
from .verify import command as verify

COMMANDS = {"simulate": simulate, "verify": verify, "train": train, "profile": profile, "bench": bench}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ballast", description=__doc__.splitlines()[0].strip("`"))
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        module.add_arguments(p)
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except ValueError as e:
        # User errors (bad input, a plan that cannot exist) end with their message, not a trace.
        print(f"ballast {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
