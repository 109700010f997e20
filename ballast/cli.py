"""`ballast` command line: one subcommand per job; each lives in its own module."""
from __future__ import annotations

import argparse
import sys

from . import profile as profile_cmd
from . import simulate_cmd, verify
from .benchmark import command as bench_cmd
from .train import command as train_cmd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ballast", description=__doc__.splitlines()[0].strip("`"))
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {"simulate": simulate_cmd, "verify": verify, "train": train_cmd,
                "profile": profile_cmd, "bench": bench_cmd}
    for name, module in commands.items():
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        module.add_arguments(p)
    args = parser.parse_args(argv)
    try:
        return commands[args.command].run(args)
    except ValueError as e:
        # User errors (bad input, a plan that cannot exist) end with their message, not a trace.
        print(f"ballast {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
