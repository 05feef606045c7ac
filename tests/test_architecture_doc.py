"""docs/architecture.md stays true: each excerpt is still in the example file it names (the
examples themselves are run by tests/test_extend_*.py), every module it names exists, and the
tier kinds are spelled out in one place only."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
EXCERPT = re.compile(r"<!-- excerpt: (\S+) -->\n```\w*\n(.*?)```", re.S)


def test_every_excerpt_is_in_its_example_file() -> None:
    found = EXCERPT.findall(DOC.read_text())
    assert len(found) == 5
    for path, code in found:
        assert code.strip() in (ROOT / path).read_text(), f"{path}: the excerpt has drifted"


def test_every_module_the_doc_names_exists() -> None:
    groups = {"kvsim.policies", "kvsim.routers", "kvsim.compression", "kvsim.trace_formats"}
    names = set(re.findall(r"`(kvsim(?:\.\w+)+)", DOC.read_text())) - {"kvsim.trace_formats"}
    assert groups - names == {"kvsim.trace_formats"}  # entry point groups; the rest are modules
    assert len(names) > 20
    for name in sorted(names):
        parts = name.split(".")
        for cut in range(len(parts), 1, -1):  # a module, or an attribute of one
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            break
        else:
            raise AssertionError(f"{name} is not a module")


def test_tier_names_are_spelled_out_only_in_the_tier_kind_table() -> None:
    table = re.compile(r"""["']dram["'],\s*["']cxl["']""")
    spelled = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "kvsim").rglob("*.py")
        if table.search(p.read_text())
    ]
    assert spelled == [], spelled
