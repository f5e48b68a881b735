"""``maple-acp-connector``: the minimal connector entry point."""

from __future__ import annotations

import sys

from maple_acp_connector._version import __version__


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("--version", "-V"):
        sys.stdout.write(f"maple-acp {__version__}\n")
        return 0
    sys.stderr.write("maple-acp-connector: the relay is not available in this build\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
