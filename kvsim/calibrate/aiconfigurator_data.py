"""Read NVIDIA's measured per-kernel database shipped in the ``aiconfigurator-core`` wheel.

AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships its per-operation latency
tables as Parquet files in ``aiconfigurator_core/systems/data/<gpu>/<family>/<engine>/<version>/``
of the wheel on PyPI. This module is kvsim's one reader of them: it finds the tables in the wheel
itself (read as a zip, nothing extracted), in an extracted copy, or in the subset kvsim ships
(benchmarks/data/aiconfigurator/), and returns them with SI units and plain column names.

Units, as the tables store them and as returned:

- ``latency`` is milliseconds in every table; returned as ``latency_s`` in seconds.
- ``message_size`` of the all-reduce tables counts elements, not bytes: read as bytes, NCCL's
  2-GPU bf16 all-reduce of 256 Mi on h100_sxm (1.686 ms) would reach a bus bandwidth of 159 GB/s,
  half of what the same table's int8 rows (1-byte elements, 310 GB/s) and vLLM's custom
  all-reduce (334 GB/s as elements) reach. Returned as ``message_bytes`` = elements x element size.
- Attention heads (``num_heads``, ``num_key_value_heads``) are per GPU, as the kernel ran.
- Generation attention rows have ``isl`` 1 and ``step`` s; the query attends ``isl + step`` cached
  tokens, returned as ``context_tokens`` (AIConfigurator's collectors time decode step ``step``
  of a sequence whose prompt was ``isl`` tokens).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pandas as pd

from kvsim.errors import ConfigError

PACKAGE = "aiconfigurator-core"
PYPI_URL = "https://pypi.org/project/aiconfigurator-core/"
LICENCE = "Apache-2.0"
ENV_VAR = "KVSIM_AICONFIGURATOR"
#: Where the tables sit inside the wheel; every relative path this module reports is below it.
WHEEL_PREFIX = "aiconfigurator_core/systems/"
#: The subset kvsim ships (benchmarks/fetch_aiconfigurator.py --make-subset writes it).
SUBSET = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "aiconfigurator"
MANIFEST = "manifest.json"
#: Engines whose tables kvsim reads; ``comm/nccl`` and ``comm/oneccl`` are libraries, not engines.
ENGINES = ("vllm", "sglang", "trtllm")
COMM_LIBRARIES = ("nccl", "oneccl")
#: Bytes per element of the dtypes the communication tables name.
ELEMENT_BYTES = {"half": 2, "bfloat16": 2, "float16": 2, "fp16": 2, "int8": 1, "fp8": 1, "float": 4}

_GEMM = {"m": "m", "n": "n", "k": "k", "gemm_dtype": "dtype", "kernel_source": "kernel_source"}
_ATTENTION = {
    "batch_size": "batch",
    "isl": "isl",
    "num_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "kv_cache_dtype": "kv_dtype",
    "step": "step",
}
_NCCL = {"num_gpus": "num_gpus", "message_size": "message_size", "nccl_dtype": "dtype"}
_CUSTOM = {"num_gpus": "num_gpus", "message_size": "message_size", "allreduce_dtype": "dtype"}


@dataclass(frozen=True)
class _Source:
    """Where table files are: a wheel (zip members) or a folder; paths are relative to
    ``systems/`` (``data/<gpu>/...``)."""

    root: Path
    zip_prefix: str | None  # the member prefix in a wheel; None for a folder
    base: Path | None  # the folder holding ``data/``; None for a wheel
    paths: tuple[str, ...]

    def read(self, rel: str) -> bytes:
        if self.zip_prefix is not None:
            with zipfile.ZipFile(self.root) as z:
                return z.read(self.zip_prefix + rel)
        assert self.base is not None
        return (self.base / rel).read_bytes()


@dataclass(frozen=True)
class KernelDatabase:
    """AIConfigurator's kernel tables at ``root``; every reader notes the files it read in
    ``files_read`` (and in the frame's ``attrs["files"]``) so provenance can name them."""

    root: Path
    wheel_version: str
    kind: str  # "wheel", "directory" or "subset"
    _source: _Source = field(repr=False)
    _original: dict[str, str] = field(default_factory=dict, repr=False)  # subset: wheel sha256
    files_read: list[str] = field(default_factory=list, repr=False, compare=False)

    # -- what is there --------------------------------------------------------------------------
    def gpus(self) -> list[str]:
        """GPU folders that hold at least one table."""
        return sorted({p.split("/")[1] for p in self._source.paths})

    def engines(self, gpu: str) -> dict[str, list[str]]:
        """Engine -> versions present (oldest first) in any table family of ``gpu``."""
        self._check_gpu(gpu)
        found: dict[str, set[str]] = {}
        for p in self._source.paths:
            parts = p.split("/")
            if parts[1] == gpu and parts[3] not in COMM_LIBRARIES:
                found.setdefault(parts[3], set()).add(parts[4])
        return {e: sorted(v, key=version_key) for e, v in sorted(found.items())}

    def versions(self, gpu: str, family: str, engine: str, table: str) -> list[str]:
        """Versions (oldest first) that hold ``table`` (a file name) for this GPU and engine."""
        out = {
            p.split("/")[4]
            for p in self._source.paths
            if p.split("/")[1:4] == [gpu, family, engine] and p.endswith("/" + table)
        }
        return sorted(out, key=version_key)

    # -- readers --------------------------------------------------------------------------------
    def gemm(self, gpu: str, engine: str, version: str | None = None) -> pd.DataFrame:
        """GEMM latency: m, n, k, dtype, latency_s, kernel_source (one row per measurement)."""
        frame, rel = self._table(gpu, "gemm", engine, "gemm_perf.parquet", version, _GEMM)
        out = frame.rename(columns=_GEMM)
        out["latency_s"] = _seconds(out.pop("latency"), rel)
        return _finish(out, ["m", "n", "k", "dtype", "latency_s", "kernel_source"], rel, True)

    def context_attention(self, gpu: str, engine: str, version: str | None = None) -> pd.DataFrame:
        """Prefill attention of one layer: batch sequences of isl new tokens each, no cache."""
        return self._attention(gpu, engine, version, "context_attention_perf.parquet")

    def generation_attention(
        self, gpu: str, engine: str, version: str | None = None
    ) -> pd.DataFrame:
        """Decode attention of one layer: batch queries, each over ``context_tokens`` = isl +
        step cached tokens."""
        out = self._attention(gpu, engine, version, "generation_attention_perf.parquet")
        out.insert(out.columns.get_loc("step") + 1, "context_tokens", out["isl"] + out["step"])
        return out

    def allreduce(self, gpu: str, engine: str, version: str | None = None) -> pd.DataFrame:
        """All-reduce latency by implementation: the engine's own (custom_graph, custom_eager,
        trtllm, ...) from ``comm/<engine>`` and ``nccl`` from ``comm/nccl`` (its newest
        version; ``version`` picks the engine's table only)."""
        frames = []
        custom_versions = self.versions(gpu, "comm", engine, "custom_allreduce_perf.parquet")
        nccl_versions = self.versions(gpu, "comm", "nccl", "nccl_perf.parquet")
        if not custom_versions and not nccl_versions:
            self._check_gpu(gpu)
            raise ConfigError(
                f"{self.root}: no all-reduce tables for {gpu} (comm/{engine}/*/"
                f"custom_allreduce_perf.parquet or comm/nccl/*/nccl_perf.parquet); engines with "
                f"tables: {', '.join(self.engines(gpu)) or 'none'}"
            )
        if custom_versions or version is not None:
            frame, rel = self._table(
                gpu, "comm", engine, "custom_allreduce_perf.parquet", version, _CUSTOM
            )
            frame = frame.rename(columns=_CUSTOM)
            frame["implementation"] = [_implementation(k) for k in frame["kernel_source"]]
            frames.append((frame, rel))
        if nccl_versions:
            frame, rel = self._table(gpu, "comm", "nccl", "nccl_perf.parquet", None, _NCCL)
            if "op_name" in frame.columns:
                frame = frame[frame["op_name"] == "all_reduce"]
            frame = frame.rename(columns=_NCCL)
            frame["implementation"] = "nccl"
            frames.append((frame, rel))
        parts = []
        for frame, rel in frames:
            nbytes = [ELEMENT_BYTES.get(str(d)) for d in frame["dtype"]]
            if any(b is None for b in nbytes):
                bad = sorted({str(d) for d, b in zip(frame["dtype"], nbytes, strict=True) if not b})
                raise ConfigError(
                    f"{rel}: element dtype {bad[0]!r} unknown; expected one of "
                    f"{sorted(ELEMENT_BYTES)}"
                )
            part = pd.DataFrame(
                {
                    "implementation": frame["implementation"].to_numpy(),
                    "num_gpus": frame["num_gpus"].to_numpy(),
                    "message_bytes": frame["message_size"].to_numpy()
                    * pd.Series(nbytes).to_numpy(),
                    "message_elements": frame["message_size"].to_numpy(),
                    "dtype": frame["dtype"].astype(str).to_numpy(),
                    "latency_s": _seconds(frame["latency"], rel).to_numpy(),
                    "kernel_source": frame["kernel_source"].astype(str).to_numpy(),
                    "file": rel,
                }
            )
            parts.append(part)
        out = pd.concat(parts, ignore_index=True)
        out.attrs["files"] = [rel for _, rel in frames]
        return out

    # -- provenance -----------------------------------------------------------------------------
    def provenance(self, files: Iterable[str] | None = None) -> dict[str, Any]:
        """Where ``files`` (default: every file read so far) came from: package, version, licence,
        and each file's path in the wheel with the sha256 of the bytes read (for the shipped
        subset, also the sha256 of the whole table in the wheel)."""
        names = list(dict.fromkeys(self.files_read if files is None else files))
        entries = []
        for rel in names:
            entry = {
                "path": WHEEL_PREFIX + rel,
                "sha256": hashlib.sha256(self._source.read(rel)).hexdigest(),
            }
            if rel in self._original:
                entry["wheel_sha256"] = self._original[rel]
                entry["subset"] = "rows kept by benchmarks/fetch_aiconfigurator.py --make-subset"
            entries.append(entry)
        return {
            "package": PACKAGE,
            "wheel_version": self.wheel_version,
            "source": PYPI_URL,
            "licence": LICENCE,
            "read_from": f"{self.kind} {self.root}",
            "files": entries,
        }

    # -- internals ------------------------------------------------------------------------------
    def _check_gpu(self, gpu: str) -> None:
        if gpu not in self.gpus():
            raise ConfigError(
                f"{self.root}: no tables for GPU {gpu!r}; GPUs with tables: "
                f"{', '.join(self.gpus())}"
            )

    def _table(
        self,
        gpu: str,
        family: str,
        engine: str,
        table: str,
        version: str | None,
        needed: dict[str, str],
    ) -> tuple[pd.DataFrame, str]:
        """One table as stored, checked for the columns kvsim reads; (frame, relative path)."""
        self._check_gpu(gpu)
        have = self.versions(gpu, family, engine, table)
        if not have:
            with_table = sorted(
                {
                    p.split("/")[3]
                    for p in self._source.paths
                    if p.split("/")[1:3] == [gpu, family] and p.endswith("/" + table)
                }
            )
            raise ConfigError(
                f"{self.root}: no {family}/{engine}/*/{table} for {gpu}; engines with that "
                f"table: {', '.join(with_table) or 'none'}"
            )
        if version is None:
            version = have[-1]
        elif version not in have:
            raise ConfigError(
                f"{self.root}: no {family}/{engine}/{version}/{table} for {gpu}; versions with "
                f"that table: {', '.join(have)}"
            )
        rel = f"data/{gpu}/{family}/{engine}/{version}/{table}"
        try:
            frame = pd.read_parquet(io.BytesIO(self._source.read(rel)))
        except (OSError, ValueError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(
                f"{WHEEL_PREFIX}{rel}: not a readable Parquet table ({reason})"
            ) from None
        missing = [c for c in (*needed, "latency") if c not in frame.columns]
        if missing:
            raise ConfigError(
                f"{WHEEL_PREFIX}{rel}: missing column {missing[0]!r}; it has "
                f"{', '.join(map(str, frame.columns))}"
            )
        self.files_read.append(rel)
        return frame, rel

    def _attention(self, gpu: str, engine: str, version: str | None, table: str) -> pd.DataFrame:
        frame, rel = self._table(gpu, "attention", engine, table, version, _ATTENTION)
        out = frame.rename(columns=_ATTENTION)
        if "window_size" in out.columns:
            out = out.rename(columns={"window_size": "window"})
        else:  # the a100_sxm vLLM and SGLang tables predate sliding windows: full attention
            out["window"] = 0
        out["latency_s"] = _seconds(out.pop("latency"), rel)
        first = ["batch", "isl", "num_heads", "num_kv_heads", "head_dim", "kv_dtype", "window"]
        return _finish(out, [*first, "step", "latency_s"], rel, keep_rest=True)


def _implementation(kernel_source: str) -> str:
    """An engine's custom all-reduce kernel by what it is: custom_graph / custom_eager for the
    vLLM and SGLang kernels (``vLLM_custom_graph``, ``SGLang_CustomAllReduce_eager``), else the
    kernel's own name in lower case (``trtllm``, ``trtllm_mnnvl_oneshot``)."""
    name = str(kernel_source)
    low = name.lower()
    if low.startswith(("vllm_custom", "sglang_customallreduce")):
        if low.endswith("_graph"):
            return "custom_graph"
        if low.endswith("_eager"):
            return "custom_eager"
    return low


def _seconds(latency_ms: pd.Series, rel: str) -> pd.Series:
    """Milliseconds to seconds, refusing what no kernel takes (non-numbers, <= 0, NaN)."""
    values = pd.to_numeric(latency_ms, errors="coerce")
    bad = ~(values > 0)
    if bad.any():
        pos = int(bad.to_numpy().nonzero()[0][0])
        value = latency_ms.iloc[pos]
        value = value.item() if hasattr(value, "item") else value
        raise ConfigError(
            f"{WHEEL_PREFIX}{rel}: row {latency_ms.index[pos]}: latency {value!r} is not a "
            "positive number of milliseconds"
        )
    return values.astype("float64") * 1e-3


def _finish(
    frame: pd.DataFrame, first: list[str], rel: str, keep_rest: bool = False
) -> pd.DataFrame:
    rest = [c for c in frame.columns if c not in first] if keep_rest else []
    out = frame[[*first, *rest]].reset_index(drop=True)
    out.attrs["files"] = [rel]
    return out


_VERSION = re.compile(
    r"^v?(?P<release>\d+(?:\.\d+)*)(?:[.-]?(?P<pre>a|b|rc)(?P<pre_n>\d+))?"
    r"(?:\.post(?P<post>\d+))?(?:\.dev(?P<dev>\d+))?$"
)


def version_key(version: str) -> tuple:
    """Sort key in release order: 0.5.6.post2 < 0.5.9 < 0.5.10; 1.3.0rc5 < 1.3.0rc20 < 1.3.0;
    0.1.dev1 < 0.1. Names that are not versions sort first, by name."""
    m = _VERSION.match(version)
    if m is None:
        return (0, (), (), 0, 0, version)
    release = tuple(int(p) for p in m["release"].split("."))
    release += (0,) * (4 - len(release))
    if m["pre"]:
        pre: tuple = (1, "abc".index(m["pre"][0]) if m["pre"] != "rc" else 3, int(m["pre_n"]))
    elif m["dev"] and not m["post"]:
        pre = (0,)
    else:
        pre = (2,)
    return (1, release, pre, int(m["post"] or 0), int(m["dev"] or 1 << 62), version)


# -- opening ------------------------------------------------------------------------------------
def open_database(path: Path | None = None) -> KernelDatabase:
    """The database at ``path``: the wheel (.whl), an extracted wheel or ``systems`` folder, or
    kvsim's shipped subset. None: $KVSIM_AICONFIGURATOR, else an installed ``aiconfigurator_core``
    package, else the shipped subset."""
    if path is None:
        env = os.environ.get(ENV_VAR)
        if env:
            return open_database(Path(env))
        installed = _installed_package()
        return open_database(installed if installed is not None else SUBSET)
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"{path}: no such file or folder (expected the {PACKAGE} wheel, an extracted copy of "
            f"it, or kvsim's subset in benchmarks/data/aiconfigurator/)"
        )
    if path.is_file():
        return _open_wheel(path)
    return _open_folder(path)


def _installed_package() -> Path | None:
    """The folder of an installed ``aiconfigurator_core`` package, found without importing it
    (its import loads a compiled engine kvsim does not need)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("aiconfigurator_core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _open_wheel(path: Path) -> KernelDatabase:
    expected = f"expected the {PACKAGE} wheel (a zip holding {WHEEL_PREFIX}data/)"
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            metadata = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            meta_text = z.read(metadata[0]).decode("utf-8", "replace") if metadata else ""
    except (zipfile.BadZipFile, OSError) as exc:
        raise ConfigError(f"{path}: not a readable zip ({exc}); {expected}") from None
    prefix = WHEEL_PREFIX
    inside = (n[len(prefix) :] for n in names if n.startswith(prefix))
    paths = tuple(sorted(rel for rel in inside if _is_table(rel)))
    if not paths:
        raise ConfigError(f"{path}: no {prefix}data/<gpu>/.../*.parquet members; {expected}")
    version = _metadata_version(meta_text)
    if version is None:
        raise ConfigError(f"{path}: no Version line in *.dist-info/METADATA; {expected}")
    source = _Source(path, prefix, None, paths)
    return KernelDatabase(path, version, "wheel", source)


def _open_folder(path: Path) -> KernelDatabase:
    expected = (
        f"expected an extracted {PACKAGE} wheel (aiconfigurator_core/systems/data/), a systems "
        "folder (systems/data/ or data/), or kvsim's subset (manifest.json beside systems/data/)"
    )
    base = None
    for candidate in (path / "aiconfigurator_core" / "systems", path / "systems", path):
        if (candidate / "data").is_dir():
            base = candidate
            break
    if base is None:
        raise ConfigError(f"{path}: no data/ folder of tables; {expected}")
    paths = tuple(
        sorted(
            p.relative_to(base).as_posix()
            for p in (base / "data").rglob("*.parquet")
            if _is_table(p.relative_to(base).as_posix())
        )
    )
    if not paths:
        raise ConfigError(f"{base / 'data'}: no <gpu>/<family>/<engine>/<version>/*.parquet")
    manifest = path / MANIFEST
    if manifest.is_file():
        import json

        try:
            doc = json.loads(manifest.read_text(encoding="utf-8"))
            version = str(doc["wheel_version"])
            original = {str(k): str(v["wheel_sha256"]) for k, v in doc["files"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"{manifest}: not kvsim's subset manifest (wheel_version and files[path]."
                f"wheel_sha256 expected; {type(exc).__name__}: {exc})"
            ) from None
        return KernelDatabase(path, version, "subset", _Source(path, None, base, paths), original)
    version = _folder_version(path, base)
    if version is None:
        raise ConfigError(
            f"{path}: cannot tell the {PACKAGE} version (no *.dist-info/METADATA beside "
            f"aiconfigurator_core/ and no {MANIFEST}); {expected}"
        )
    return KernelDatabase(path, version, "directory", _Source(path, None, base, paths))


def _is_table(rel: str) -> bool:
    """``data/<gpu>/<family>/<engine>/<version>/<table>.parquet`` (relative to systems/)."""
    parts = PurePosixPath(rel).parts
    return len(parts) == 6 and parts[0] == "data" and parts[5].endswith(".parquet")


def _metadata_version(text: str) -> str | None:
    m = re.search(r"(?m)^Version:\s*(\S+)\s*$", text)
    return m.group(1) if m else None


def _folder_version(path: Path, base: Path) -> str | None:
    """The version in the METADATA of an extracted wheel (beside aiconfigurator_core/), or of
    an installed package (its dist-info beside the package folder)."""
    for where in {path, base.parent.parent, base.parent}:
        for meta in sorted(where.glob("aiconfigurator_core-*.dist-info/METADATA")):
            version = _metadata_version(meta.read_text(encoding="utf-8", errors="replace"))
            if version:
                return version
    return None
