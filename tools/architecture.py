"""kvsim's layers, read from its code: which package imports which, checked against the layer
order and drawn as docs/architecture.png.

    python tools/architecture.py          # redraw docs/architecture.png, print any violation

tests/test_architecture.py runs the same checks: no package imports one in a layer above it
(at module level or inside a function), every package has a layer, and no two modules import
each other, directly or around a loop.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvsim"

#: Bottom to top. A package may import its own layer's packages and any below, never above.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundation",
        (
            "errors",
            "units",
            "textio",
            "tomlwrite",
            "atomic",
            "plugins",
            "plugin_params",
            "compiled",
        ),
    ),
    ("inputs", ("models", "hardware", "engines", "traces", "compression", "capacity")),
    ("pluggable choices", ("costmodel", "policies", "routers")),
    ("KV cache", ("kvcache",)),
    ("measurements", ("metrics",)),
    ("engine (SimPy)", ("engine",)),
    ("a run", ("config", "resolve", "estimate", "run")),
    (
        "many runs, tools",
        ("sweep", "shard", "plan", "compare", "report", "mrc", "calibrate", "workerguard"),
    ),
    ("command line", ("cli", "__main__")),
)
LAYER_OF = {pkg: i for i, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}


@dataclass(frozen=True)
class Import:
    source: str  # module, e.g. kvsim.engine.workload
    target: str  # module or package imported, e.g. kvsim.kvcache.request
    late: bool  # inside a function or an `if TYPE_CHECKING:` block
    line: int


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> list[Import]:
    """Every import of a kvsim module by a kvsim module."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                base = node.module
                targets = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base
                           for a in node.names]  # fmt: skip
            else:
                continue
            for target in targets:
                if target == "kvsim" or target.startswith("kvsim."):
                    found.append(Import(source, target, id(node) not in top, node.lineno))
    return found


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def violations(found: list[Import]) -> list[str]:
    """Imports that go up a layer, packages without a layer, and module import cycles."""
    out = []
    packages = {package_of(module_name(p)) for p in PACKAGE.rglob("*.py")} - {"kvsim"}
    out += [f"package kvsim.{p} has no layer in LAYERS" for p in sorted(packages - set(LAYER_OF))]
    for imp in found:
        src, dst = package_of(imp.source), package_of(imp.target)
        if dst == "kvsim" or src not in LAYER_OF or dst not in LAYER_OF:
            continue
        if LAYER_OF[dst] > LAYER_OF[src]:
            kind = "late import" if imp.late else "import"
            out.append(f"{imp.source}:{imp.line}: {kind} of {imp.target} goes up a layer")
    out += [f"import cycle: {' -> '.join(c)}" for c in cycles(found)]
    return out


def cycles(found: list[Import]) -> list[list[str]]:
    """Module-level import cycles among kvsim modules (a package's __init__ counts as the
    package; an import of a package's name counts as an import of its __init__)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in found:
        if not imp.late and imp.source != imp.target:
            graph[imp.source].add(imp.target)
    out, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own modules
            if state.get(nxt) == 1:
                out.append([*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return out


def package_edges(found: list[Import]) -> set[tuple[str, str]]:
    return {
        (package_of(i.source), package_of(i.target))
        for i in found
        if package_of(i.source) != package_of(i.target) and package_of(i.target) != "kvsim"
    }


def draw(found: list[Import], path: Path) -> None:
    """One row of boxes per layer, bottom to top, and an arrow per package import."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(13, 8.5))
    where: dict[str, tuple[float, float]] = {}
    width = max(len(pkgs) for _, pkgs in LAYERS) * 1.6
    for row, (label, pkgs) in enumerate(LAYERS):
        y = row * 1.0
        ax.text(-1.0, y, label, ha="right", va="center", fontsize=10, color="#555555")
        step = width / len(pkgs)
        for col, pkg in enumerate(pkgs):
            x = (col + 0.5) * step
            where[pkg] = (x, y)
            box = {"boxstyle": "round,pad=0.35", "fc": "#e8f0fa", "ec": "#1f77b4"}
            ax.text(x, y, pkg, ha="center", va="center", fontsize=9, bbox=box, zorder=3)
    foundation = set(LAYERS[0][1])
    for src, dst in sorted(package_edges(found)):
        if src in where and dst in where and dst not in foundation:
            (x0, y0), (x1, y1) = where[src], where[dst]
            arrow = {"arrowstyle": "->", "color": "#888888", "lw": 0.6, "alpha": 0.6}
            ax.annotate("", xy=(x1, y1 + 0.2), xytext=(x0, y0 - 0.2), arrowprops=arrow)
    ax.set_xlim(-4.2, width + 0.2)
    ax.set_ylim(-0.6, len(LAYERS) - 0.4)
    ax.axis("off")
    ax.set_title(
        "kvsim's packages by layer, drawn from its imports by tools/architecture.py: an arrow is "
        "an import\n(always downwards; imports of the foundation layer, which every layer uses, "
        "are left out)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    found = imports()
    problems = violations(found)
    for problem in problems:
        print(problem)
    draw(found, ROOT / "docs" / "architecture.png")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
