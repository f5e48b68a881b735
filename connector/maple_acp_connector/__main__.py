"""``maple-acp-connector`` (and ``maple-acp acp``): bridge stdio to the running host.

An ACP client starts this for every session, so it decides ``--version`` and ``--help`` with
nothing imported beyond the version string, and the relay itself imports only the standard
library. Arguments are parsed by hand for the same reason (argparse alone costs milliseconds).

Diagnostics are single lines written straight to stderr rather than through ``logging``: they
are this command's user-facing output, and stdout carries nothing but the host's bytes.
"""

from __future__ import annotations

import sys

from maple_acp_connector._version import __version__

PROG = "maple-acp-connector"

_HELP = """\
usage: {prog} [--socket PATH]
       {prog} --version | --help

Bridge this process's stdin and stdout to the maple-acp service of this installation over its
owner-only Unix socket. It never starts the service, never authenticates and never launches
anything: if no service is listening it says so on stderr and exits.

options:
  --socket PATH   connect to PATH instead of this installation's endpoint
  -V, --version   print "maple-acp <version>" and exit without touching any socket
  -h, --help      show this help and exit

environment:
  MAPLE_ACP_SOCKET     endpoint to use when --socket is not given
  MAPLE_ACP_RELAY_ENV  comma-separated names of environment variables whose values are sent
                       to the service in a _maple/bridge/hello line before any other traffic
                       (at most 16 values, each at most 16 KiB, 32 KiB in all, no NUL; a value
                       outside these bounds is skipped with a note on stderr)

exit status:
  0    stdin ended and the service then closed the connection
  1    the service is unavailable, or the endpoint is not a socket owned by this user
       with no group/other permissions
  2    usage error
  3    the service closed the connection while stdin was still open
  129 130 141 143
       ended by SIGHUP, SIGINT, SIGPIPE (also: the client stopped reading stdout), SIGTERM
"""


EXIT_USAGE = 2  # the other statuses live with the relay, which this module loads lazily


def _usage_error(prog: str, message: str) -> int:
    sys.stderr.write(f"{prog}: {message}\n{prog}: try '{prog} --help'\n")
    return EXIT_USAGE


def main(argv: list[str] | None = None, *, prog: str = PROG) -> int:
    """Run the connector with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    args = sys.argv[1:] if argv is None else argv
    cli_socket: str | None = None
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg in ("-V", "--version"):
            sys.stdout.write(f"maple-acp {__version__}\n")
            sys.stdout.flush()
            return 0
        if arg in ("-h", "--help"):
            sys.stdout.write(_HELP.format(prog=prog))
            sys.stdout.flush()
            return 0
        if arg == "--socket":
            if index == len(args):
                return _usage_error(prog, "--socket needs a PATH")
            cli_socket = args[index]
            index += 1
        elif arg.startswith("--socket="):
            cli_socket = arg.removeprefix("--socket=")
        else:
            return _usage_error(prog, f"unexpected argument {arg!r}")
        if not cli_socket:
            return _usage_error(prog, "--socket needs a non-empty PATH")

    from maple_acp_connector._relay import run

    return run(cli_socket)


if __name__ == "__main__":
    sys.exit(main())
