"""Build hook for the optional compiled build: with KVSIM_COMPILE=1, mypyc compiles
`kvsim.compiled.HOT_MODULES` to C extensions (README, "Compiled build"); otherwise kvsim
installs as pure Python. Everything else about the package is in pyproject.toml."""

import os
import runpy

from setuptools import setup

ext_modules = []
if os.environ.get("KVSIM_COMPILE") == "1":
    from mypyc.build import mypycify  # mypy's compiler: `pip install mypy` before building

    hot = runpy.run_path(os.path.join("kvsim", "compiled.py"))["HOT_MODULES"]
    paths = [name.replace(".", "/") + ".py" for name in hot]
    ext_modules = mypycify(paths, opt_level="3", debug_level="0")

setup(ext_modules=ext_modules)
