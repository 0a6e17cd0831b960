"""`optirack`: the command-line client (rack file checks, and the controller's REST API)."""
from __future__ import annotations

import argparse
import sys

from controller.core.rack import RackError, load_rack


def _check_topology(args: argparse.Namespace) -> int:
    try:
        rack = load_rack(args.file)
    except RackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(rack.summary())
    print(f"{args.file}: OK")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optirack",
        description="Client for optirack, the SDN control plane of optically reconfigurable GPU racks.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser("check-topology", help="validate a rack file and print its summary",
                       description="Validate a rack file. Exit 0 if it is good, 2 with the field at fault if not.")
    p.add_argument("file", help="rack file (YAML), e.g. topologies/paper-testbed.yaml")
    p.set_defaults(func=_check_topology)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
