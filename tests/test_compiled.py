"""The optional compiled build's bookkeeping (kvsim.compiled): which modules it compiles, and
how `import kvsim` tells an extension older than its source. That the compiled build gives the
interpreted build's results is CI's check (.ci/run: benchmarks/result_digests.py under both)."""

from __future__ import annotations

import json
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

import kvsim.compiled as compiled

ROOT = Path(compiled.__file__).resolve().parent.parent


def test_every_hot_module_is_a_source_file_of_the_package() -> None:
    for name in compiled.HOT_MODULES:
        assert ROOT.joinpath(*name.split(".")).with_suffix(".py").is_file(), name
    assert len(set(compiled.HOT_MODULES)) == len(compiled.HOT_MODULES)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the hot modules' sources, with the module's paths pointed at it."""
    for name in compiled.HOT_MODULES:
        path = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {name}\n")
    monkeypatch.setattr(compiled, "_ROOT", tmp_path)
    monkeypatch.setattr(compiled, "RECORD", tmp_path / "kvsim" / "compiled_sources.json")
    return tmp_path


def _build(tree: Path, name: str) -> None:
    """Stand-in for setup.py: an extension beside `name`'s source and the digests recorded."""
    source = tree.joinpath(*name.split(".")).with_suffix(".py")
    source.with_name(source.stem + EXTENSION_SUFFIXES[0]).write_bytes(b"")
    compiled.RECORD.write_text(json.dumps(compiled.source_digests()))


def test_a_pure_python_tree_has_nothing_stale(tree: Path) -> None:
    assert compiled.stale_extensions() == []


def test_an_extension_is_stale_once_its_source_changes_and_not_when_rewritten_unchanged(
    tree: Path,
) -> None:
    link = "kvsim.kvcache.link"
    _build(tree, link)
    assert compiled.stale_extensions() == []
    source = tree / "kvsim" / "kvcache" / "link.py"
    text = source.read_text()
    source.write_text(text)  # a checkout that rewrites it unchanged: newer, not stale
    assert compiled.stale_extensions() == []
    source.write_text(text + "x = 1\n")
    assert compiled.stale_extensions() == [link]
    # a changed source without an extension beside it is plain Python: not stale
    (tree / "kvsim" / "engine" / "scheduler.py").write_text("y = 2\n")
    assert compiled.stale_extensions() == [link]


def test_extensions_without_a_record_are_stale(tree: Path) -> None:
    _build(tree, "kvsim.kvcache.manager")
    compiled.RECORD.unlink()
    assert compiled.stale_extensions() == ["kvsim.kvcache.manager"]


def test_this_process_runs_the_build_its_checkout_has() -> None:
    built = [n for n in compiled.HOT_MODULES if compiled._extension(n) is not None]
    assert compiled.compiled_modules() == built
