"""The layers hold: no package imports one above it, every package has a layer, no module
import cycles (tools/architecture.py reads the imports; docs/architecture.md shows them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "architecture.py"


def _tool():
    spec = importlib.util.spec_from_file_location("kvsim_architecture", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_no_import_goes_up_a_layer_and_no_module_cycles() -> None:
    tool = _tool()
    found = tool.imports()
    assert len(found) > 300  # the reader sees the whole package
    assert tool.violations(found) == []


def test_the_checks_catch_an_upward_import_and_a_cycle() -> None:
    tool = _tool()
    up = tool.Import("kvsim.kvcache.manager", "kvsim.engine.scheduler", late=True, line=1)
    assert tool.violations([up]) == [
        "kvsim.kvcache.manager:1: late import of kvsim.engine.scheduler goes up a layer"
    ]
    loop = [
        tool.Import("kvsim.run", "kvsim.resolve", late=False, line=1),
        tool.Import("kvsim.resolve", "kvsim.run", late=False, line=2),
    ]
    assert any(v.startswith("import cycle") for v in tool.violations(loop))


def test_lower_layers_never_import_the_engine() -> None:
    tool = _tool()
    for imp in tool.imports():
        if tool.package_of(imp.source) in ("kvcache", "metrics", "policies", "routers"):
            assert tool.package_of(imp.target) != "engine", imp
