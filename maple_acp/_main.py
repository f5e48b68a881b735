"""Console entry point of ``maple-acp``.

``maple-acp acp`` and ``maple-acp --version`` are what ACP clients run on every session and on
every diagnostics probe, so they are decided on ``argv[1]`` before ``click`` or ``trio`` is
imported (importing those costs ~165 ms; the connector needs neither).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("--version", "-V"):
        if len(args) > 1:
            sys.stderr.write(
                f"maple-acp: {args[0]} takes no arguments (got {args[1]!r})\n"
                "Try 'maple-acp --help' for help.\n"
            )
            return 2
        from maple_acp_connector import __version__

        sys.stdout.write(f"maple-acp {__version__}\n")
        return 0
    if args and args[0] == "acp":
        from maple_acp_connector.__main__ import main as connector_main

        return connector_main(args[1:], prog="maple-acp acp")
    from maple_acp.cli import cli

    return int(cli.main(args=args, prog_name="maple-acp", standalone_mode=True) or 0)


if __name__ == "__main__":
    sys.exit(main())
