"""`python -m kvsim.calibrate ...`: the calibrate command on its own (same as `kvsim calibrate`)."""

from kvsim.calibrate.cli import main

if __name__ == "__main__":
    main()
