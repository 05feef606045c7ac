"""`python -m kvsim` and the `kvsim` console script.

The entry point lives here, not in `kvsim.cli`, because importing `kvsim.cli` is itself the slow
part of starting up (click, numpy, pyarrow, the engine: a second or more on a busy machine). A
Ctrl-C in that second used to end in a KeyboardInterrupt traceback; here the import runs inside
the handler, so Ctrl-C at any moment ends as it does mid-run: one line and exit code 130.
"""

import signal
import sys

#: 128 + SIGINT: the shell's exit code for a command ended by Ctrl-C.
INTERRUPTED = 130


def main(argv: list[str] | None = None) -> None:
    """Run the command line; Ctrl-C while it starts up, or at any later moment, exits 130."""
    try:
        from kvsim.cli import main as cli_main

        cli_main(argv)
    except KeyboardInterrupt:
        interrupted()


def interrupted() -> None:
    """Say in one line that the command was interrupted, and exit 130."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break this line
    try:
        sys.stderr.write("\nkvsim: aborted\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: the exit code still tells
        pass
    sys.exit(INTERRUPTED)


if __name__ == "__main__":
    main()
