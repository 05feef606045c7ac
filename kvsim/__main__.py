"""`python -m kvsim` runs the command-line interface."""

from kvsim.cli import main

main()
