"""Fetch NVIDIA's aiconfigurator-core wheel (its measured kernel database) and rebuild kvsim's
shipped subset of it.

    python benchmarks/fetch_aiconfigurator.py                 # download + verify into --dest
    python benchmarks/fetch_aiconfigurator.py --make-subset   # ... and rewrite the subset
    python benchmarks/fetch_aiconfigurator.py --check-interpolation  # GEMM interpolation error

The wheel (Apache-2.0, https://pypi.org/project/aiconfigurator-core/) is 82 MB; kvsim ships only
the rows its catalog models need in benchmarks/data/aiconfigurator/ (PROVENANCE.md there says
which and why). Point kvsim at the whole wheel with --data or $KVSIM_AICONFIGURATOR.

The subset is deterministic: the same wheel and the same kvsim catalog give the same bytes
(pyarrow writes the files; its version is recorded in the manifest).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

VERSION = "0.12.0"
WHEEL = f"aiconfigurator_core-{VERSION}-cp311-abi3-manylinux_2_28_x86_64.whl"
#: sha256 of WHEEL as PyPI served it on 2026-12-02 (checked by this script on every fetch).
WHEEL_SHA256 = "aadc4aad0a00bf8a61c477c62bef43de479849c3aa0b1c3078068e08309eccc4"
PREFIX = "aiconfigurator_core/systems/"
HERE = Path(__file__).resolve().parent
SUBSET = HERE / "data" / "aiconfigurator"
CACHE = Path.home() / ".cache" / "kvsim" / "aiconfigurator"
#: The GPUs the database measures under NVIDIA engines (b60 is Intel's, measured with oneCCL).
GPUS = (
    "a100_sxm",
    "h100_sxm",
    "h200_sxm",
    "b200_sxm",
    "b300_sxm",
    "gb200",
    "gb300",
    "l40s",
    "rtx_pro_6000_server",
)
ENGINES = ("vllm", "sglang", "trtllm")
TP_DEGREES = (1, 2, 4, 8)
GEMM_DTYPES = ("bfloat16", "fp8")
MAX_M = 8192  # prefill chunks above this are rare in serving; the full wheel has m to 32768


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(dest: Path) -> Path:
    """The verified wheel in ``dest``, downloaded with pip when it is not there yet."""
    wheel = dest / WHEEL
    if not wheel.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--platform",
            "manylinux_2_28_x86_64",
            "--python-version",
            "3.11",
            f"aiconfigurator-core=={VERSION}",
            "--dest",
            str(dest),
        ]
        print(" ".join(cmd))
        subprocess.run(cmd, check=True)
    got = sha256(wheel)
    if got != WHEEL_SHA256:
        raise SystemExit(f"{wheel}: sha256 {got}, expected {WHEEL_SHA256}; delete it and refetch")
    print(f"{wheel}: sha256 {got} (verified)")
    return wheel


# -- which rows the subset keeps -------------------------------------------------------------------
def catalog_needs() -> tuple[set[tuple[int, int]], set[tuple[int, int, int]]]:
    """((n, k) GEMM shapes, per-GPU attention (heads, kv heads, head dim)) of kvsim's catalog
    models that the measured cost model can price (dense, one attention shape), at TP 1/2/4/8."""
    from kvsim.costmodel.shapes import gemm_shapes, supported
    from kvsim.models import kv_heads_per_rank, load_model, model_names

    sizes: set[tuple[int, int]] = set()
    heads: set[tuple[int, int, int]] = set()
    for name in model_names():
        model = load_model(name)
        if supported(model) is not None:  # the measured cost model cannot price it anyway
            continue
        for tp in TP_DEGREES:
            for shape in gemm_shapes(model, tp).values():
                sizes.add((shape.n, shape.k))
            for g in model.layer_groups:
                if g.kind in ("full", "sliding"):
                    kvh = kv_heads_per_rank(g.num_kv_heads, tp)
                    heads.add((max(1, g.num_heads // tp), kvh, g.head_dim_k))
    return sizes, heads


def bracket(grid: np.ndarray, v: int) -> set[int]:
    """The grid point equal to ``v``, or those just below and above it; none when ``v`` is
    outside the grid (the import fills such shapes from the roofline)."""
    grid = np.unique(grid)
    i = int(np.searchsorted(grid, v))
    if i < len(grid) and grid[i] == v:
        return {int(v)}
    if i == 0 or i == len(grid):
        return set()
    return {int(grid[i - 1]), int(grid[i])}


def corners(n_grid: np.ndarray, k_grid: np.ndarray, shapes: set[tuple[int, int]]) -> set:
    """The measured (n, k) shapes around each model shape: what interpolating a model's shape
    between measured shapes reads (kvsim.calibrate.aiconfigurator_import)."""
    return {(n, k) for sn, sk in shapes for n in bracket(n_grid, sn) for k in bracket(k_grid, sk)}


def newest(versions: list[str]) -> str:
    from kvsim.calibrate.aiconfigurator_data import version_key

    return sorted(versions, key=version_key)[-1]


def keep_rows(rel: str, table: pa.Table, sizes: set[int], heads: set) -> np.ndarray:
    """Row mask of one table (``rel`` below systems/)."""
    name = rel.rsplit("/", 1)[-1]
    col = {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}
    if name == "gemm_perf.parquet":
        near = corners(col["n"], col["k"], sizes)
        code = col["n"].astype(np.int64) * (1 << 32) + col["k"].astype(np.int64)
        pair = np.isin(code, [n * (1 << 32) + k for n, k in near])
        return np.isin(col["gemm_dtype"], GEMM_DTYPES) & pair & (col["m"] <= MAX_M)
    if name in ("context_attention_perf.parquet", "generation_attention_perf.parquet"):
        key = zip(col["num_heads"], col["num_key_value_heads"], col["head_dim"], strict=True)
        shape = np.array([tuple(map(int, k)) in heads for k in key], dtype=bool)
        if "window_size" in col:  # the catalog's windows (4096) are not measured; full only
            shape &= col["window_size"] == 0
        return shape
    if name == "nccl_perf.parquet":
        return col["op_name"] == "all_reduce"
    if name == "custom_allreduce_perf.parquet":
        return np.ones(table.num_rows, dtype=bool)
    raise ValueError(name)


def wanted(names: list[str]) -> list[str]:
    """Tables the subset keeps (paths below systems/): per GPU, the newest GEMM and attention
    tables of each engine; every custom all-reduce and NCCL table."""
    tables: dict[tuple[str, ...], list[str]] = {}
    for n in names:
        if not n.startswith(PREFIX + "data/") or not n.endswith(".parquet"):
            continue
        rel = n[len(PREFIX) :]
        parts = rel.split("/")
        if len(parts) != 6 or parts[1] not in GPUS:
            continue
        _, gpu, family, engine, version, table = parts
        if family in ("gemm", "attention") and engine in ENGINES:
            tables.setdefault((gpu, family, engine, table), []).append(version)
        elif family == "comm" and (
            (engine in ENGINES and table == "custom_allreduce_perf.parquet")
            or (engine == "nccl" and table == "nccl_perf.parquet")
        ):
            tables.setdefault((gpu, family, engine, version, table), []).append(version)
    out = []
    for key, versions in tables.items():
        gpu, family, engine = key[:3]
        out.append(f"data/{gpu}/{family}/{engine}/{newest(versions)}/{key[-1]}")
    return sorted(out)


def make_subset(wheel: Path, out: Path) -> None:
    """Rewrite ``out``'s systems/ folder and manifest.json from the wheel."""
    sizes, heads = catalog_needs()
    target = out / "systems"
    if target.exists():
        shutil.rmtree(target)
    files: dict[str, dict] = {}
    with zipfile.ZipFile(wheel) as z:
        for rel in wanted(z.namelist()):
            raw = z.read(PREFIX + rel)
            table = pq.read_table(pa.BufferReader(raw))
            mask = keep_rows(rel, table, sizes, heads)
            # the rows kept, values untouched; pandas' schema note dropped (1-2 kB a file)
            kept = table.filter(pa.array(mask)).replace_schema_metadata(None)
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(kept, path, compression="zstd", compression_level=19, store_schema=False)
            files[rel] = {
                "wheel_sha256": hashlib.sha256(raw).hexdigest(),
                "wheel_rows": table.num_rows,
                "rows": kept.num_rows,
                "sha256": sha256(path),
            }
    manifest = {
        "package": "aiconfigurator-core",
        "wheel": WHEEL,
        "wheel_version": VERSION,
        "wheel_sha256": WHEEL_SHA256,
        "source": "https://pypi.org/project/aiconfigurator-core/",
        "licence": "Apache-2.0",
        "written_by": "benchmarks/fetch_aiconfigurator.py --make-subset",
        "pyarrow": pa.__version__,
        "rows_kept": {
            "gemm": f"{'/'.join(GEMM_DTYPES)}; m <= {MAX_M}; the measured (n, k) shapes at or "
            "around each (n, k) of kvsim's catalog models at TP 1/2/4/8 (interpolation corners)",
            "attention": "(heads, kv heads, head dim) per GPU of those models at TP 1/2/4/8; "
            "full attention (window 0) only; every batch, length and KV dtype",
            "allreduce": "every row of custom_allreduce_perf; nccl_perf's all_reduce rows",
            "versions": "gemm and attention: the newest version of each engine; comm: all",
        },
        "files": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in target.rglob("*.parquet"))
    print(f"{out}: {len(files)} tables, {total / 1e6:.2f} MB of Parquet")


def check_interpolation(wheel: Path) -> None:
    """Hold out each interior n of the bf16 GEMM grid (m <= 8192, every third k) and interpolate
    it as import-aiconfigurator does, from the grid points two steps apart (twice the spacing
    the import interpolates across): median and 90th-percentile |error|. Reports, asserts
    nothing."""
    from kvsim.calibrate.aiconfigurator_data import open_database
    from kvsim.calibrate.aiconfigurator_import import gemm_curve

    db = open_database(wheel)
    for gpu, engine in (("h100_sxm", "vllm"), ("b200_sxm", "sglang"), ("a100_sxm", "trtllm")):
        g = db.gemm(gpu, engine)
        g = g[(g["dtype"] == "bfloat16") & (g["m"] <= MAX_M)]
        ns = np.unique(g["n"])
        errors: list[float] = []
        for n in ns[1:-1]:
            rest = g[g["n"] != n]
            for k in np.unique(g["k"])[::3]:
                truth = g[(g["n"] == n) & (g["k"] == k)].groupby("m")["latency_s"].median()
                got = gemm_curve(rest[rest["k"] == k], int(n), int(k))
                if got is None or truth.empty:
                    continue
                tokens, seconds, _ = got
                t = truth.reindex(tokens).to_numpy()
                ok = np.isfinite(t)
                errors += list(np.abs(np.array(seconds)[ok] / t[ok] - 1))
        e = np.array(errors)
        print(
            f"{gpu} {engine}: {len(e)} points, median |error| {np.median(e):.1%}, "
            f"90th percentile {np.quantile(e, 0.9):.1%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=CACHE, help=f"wheel cache (default {CACHE})")
    parser.add_argument("--wheel", type=Path, default=None, help="use this wheel (verified)")
    parser.add_argument("--make-subset", action="store_true", help="rewrite the shipped subset")
    parser.add_argument("--out", type=Path, default=SUBSET, help=f"subset folder ({SUBSET})")
    parser.add_argument(
        "--check-interpolation", action="store_true", help="report GEMM interpolation error"
    )
    args = parser.parse_args()
    if args.wheel is not None:
        got = sha256(args.wheel)
        if got != WHEEL_SHA256:
            raise SystemExit(f"{args.wheel}: sha256 {got}, expected {WHEEL_SHA256}")
        wheel = args.wheel
    else:
        wheel = fetch(args.dest)
    if args.make_subset:
        make_subset(wheel, args.out)
    if args.check_interpolation:
        check_interpolation(wheel)


if __name__ == "__main__":
    main()
