"""Build hook for the optional compiled build: with KVSIM_COMPILE=1, mypyc compiles
`kvsim.compiled.HOT_MODULES` to C extensions (README, "Compiled build") and records their
sources' digests, by which `import kvsim` tells a stale extension; otherwise kvsim installs as
pure Python. Everything else about the package is in pyproject.toml."""

import json
import os
import runpy

from setuptools import setup

compile_hot_path = os.environ.get("KVSIM_COMPILE") == "1"
ext_modules = []
if compile_hot_path:
    from mypyc.build import mypycify  # mypy's compiler: `pip install mypy` before building

    compiled = runpy.run_path(os.path.join("kvsim", "compiled.py"))
    paths = [name.replace(".", "/") + ".py" for name in compiled["HOT_MODULES"]]
    # one shared library for them all, inside the package (an editable install maps only the
    # package, not the checkout's root, onto the import path)
    ext_modules = mypycify(paths, opt_level="3", debug_level="0", group_name="kvsim.hot_path")

setup(ext_modules=ext_modules)

if compile_hot_path:  # only once the build went through: a failed one leaves the old record
    digests = json.dumps(compiled["source_digests"](), indent=1, sort_keys=True)
    compiled["RECORD"].write_text(digests + "\n")
