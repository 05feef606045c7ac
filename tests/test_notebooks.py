"""Every code cell of the shipped notebooks runs, in order, without error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cells = json.loads(path.read_text())["cells"]
    namespace: dict[str, object] = {"__name__": "__notebook__"}
    for i, cell in enumerate(c for c in cells if c["cell_type"] == "code"):
        exec(compile("".join(cell["source"]), f"{path.name}[cell {i}]", "exec"), namespace)


def test_there_is_a_notebook():
    assert NOTEBOOKS
