"""`kvsim calibrate`: measure this machine and write a profile with measured tables.

PyTorch is an optional extra (``pip install 'kvsim[calibrate]'``); it is imported only when the
command runs, so the rest of kvsim never needs it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

import click

from kvsim.atomic import WriteError, check_writable, os_reason, write_file
from kvsim.errors import ConfigError, KvsimError
from kvsim.hardware.profile import HardwareProfile

NEEDS_TORCH = "kvsim calibrate needs PyTorch: pip install 'kvsim[calibrate]'"

# shipped profiles by the GPU name torch reports
_BASES = (
    ("H200", "h200-sxm"),
    ("H100", "h100-sxm"),
    ("A100", "a100-80gb"),
    ("GB200", "gb200"),
    ("B200", "b200"),
    ("MI300X", "mi300x"),
)


def base_for(device_name: str) -> str | None:
    """The shipped profile of a GPU by its name, or None when kvsim has none."""
    for key, name in _BASES:
        if key in device_name.upper():
            return name
    return None


def steady_allocator() -> bool:
    """Keep freed memory in the process instead of returning it to the system (glibc only;
    True when it applied). By default glibc serves large blocks by ``mmap`` and gives them
    back when freed, so the next op's output of that size pays page faults again, and how
    often depends on the allocator's history: one layer's elementwise work at 256 tokens
    (hidden 2048) measured 6.6-7.7 ms in three runs' tables on the build machine, 3.6 ms
    steadily with this, and held-out elementwise errors fell from 36-62% to 5-23%.
    Process-wide, so the command calls it (on a CPU) and ``run_calibration`` does not."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(
            libc.mallopt(m_trim_threshold, 1 << 30)
        )
    except (OSError, AttributeError):
        return False


class Progress:
    """Where a calibration stands, on ``stream`` (stderr): one line per phase, stamped with
    the seconds elapsed; on a terminal, also a line that updates in place while points are
    timed, with the points done and an estimate of the seconds left (``bench.measure``)."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.start = time.monotonic()
        self.shown = 0.0  # when the updating line was last written (0: not on screen)

    def _clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.shown = 0.0

    def phase(self, message: str) -> None:
        """A line that stays: the next phase has begun."""
        self._clear()
        self.stream.write(f"  [{time.monotonic() - self.start:5.1f} s] {message}\n")
        self.stream.flush()

    def update(self, done: int, total: int, seconds_left: float) -> None:
        """The updating line (terminals only, at most 5 times a second, and at the end)."""
        now = time.monotonic()
        if not self.tty or (now - self.shown < 0.2 and done < total):
            return
        self.stream.write(
            f"\r\033[K  [{now - self.start:5.1f} s] timed {done}/{total} points, "
            f"about {seconds_left:.0f} s of timing left"
        )
        self.stream.flush()
        self.shown = now
        if done == total:
            self._clear()


def run_calibration(
    model_name: str,
    out: Path,
    *,
    device: str = "cpu",
    tp: int = 1,
    quick: bool = False,
    base: str | None = None,
    dtype: str = "bf16",
    storage_dir: str | None = None,
    threads: int | None = None,
    log=None,
    progress=None,
):
    """The whole pipeline as a Python call: measure, write the profile and its report, load the
    profile back through validation. Returns (Calibration, HardwareProfile, report paths).
    ``log(message)`` hears each phase, ``progress(done, total, seconds_left)`` each timed point.
    """
    try:
        import torch
    except ImportError:
        raise KvsimError(NEEDS_TORCH) from None
    from kvsim.calibrate.report import write_report
    from kvsim.calibrate.run import calibrate
    from kvsim.calibrate.write import profile_toml
    from kvsim.hardware import load_profile, validate_profile
    from kvsim.models import load_model

    if out.suffix != ".toml":
        raise ConfigError(f"--out: expected a .toml path, got {out}")
    model = load_model(model_name)
    _check_out(out, overwrite=True)  # before minutes of measuring
    base_profile = None
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: PyTorch sees no CUDA device; use --device cpu")
        base = base or base_for(torch.cuda.get_device_name(0))
        if base is None:
            raise ConfigError(
                f"--base: no shipped profile for {torch.cuda.get_device_name(0)!r}; "
                "name one (kvsim profile list) for the datasheet roofline"
            )
    if base:
        base_profile = load_profile(base)
        if base_profile.measured:
            base_profile = __import__("dataclasses").replace(base_profile, measured={})
    result = calibrate(
        model,
        base_profile,
        name=out.stem,
        device=device,
        tp=tp,
        quick=quick,
        dtype=dtype,
        kv_dtype=dtype,
        storage_dir=storage_dir,
        threads=threads,
        log=log,
        progress=progress,
    )
    profile = write_file(
        out,
        profile_toml(result.profile),
        what="the profile",
        make_parents=True,
        check=validate_profile,
    )
    if log:
        log("report and plots")
    try:
        paths = write_report(result, model, out)
    except OSError as exc:
        raise WriteError(
            f"{out.with_suffix('.report.md')}: cannot write the report (the profile {out} is "
            f"written): {os_reason(exc)}"
        ) from None
    return result, profile, paths


def _check_out(out: Path, overwrite: bool) -> None:
    """One WriteError line, before any work, when the profile cannot be written to `out`: a
    folder there, a file there without --overwrite, a folder (or the nearest one that exists,
    where the missing ones will be made) that cannot be written. Creates nothing."""
    if out.is_dir():
        raise WriteError(f"--out {out}: is a folder; give a profile file such as NAME.toml")
    if not overwrite and out.exists():
        raise WriteError(f"--out {out}: already exists; pass --overwrite to replace it")
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise WriteError(f"--out {out}: {folder} is a file, not a folder")
    check_writable(folder, "the profile")


class _MeasureByDefault(click.Group):
    """``kvsim calibrate OPTIONS`` measures, as it always has; ``kvsim calibrate import-vidur``
    (or any other subcommand named first) runs that subcommand instead."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h")):
            args = ["measure", *args]
        return super().parse_args(ctx, args)


@click.group("calibrate", cls=_MeasureByDefault)
def calibrate() -> None:
    """Measured kernel costs for a profile: measure this machine (the default: kvsim calibrate
    [measure] OPTIONS), import Vidur's public profiling data (import-vidur) or NVIDIA's
    AIConfigurator kernel database (import-aiconfigurator)."""


@calibrate.command("measure")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True)
@click.option("--model", "model_name", required=True, help="Catalog name or model TOML file.")
@click.option(
    "--tp",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Tensor-parallel degree: kernels are timed at one rank's shapes.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Smaller sweep (CPU: under a minute and 2 GB for any model, timing a proxy of a "
    "large model's shapes; GPU: < 5 minutes).",
)
@click.option(
    "--base",
    default=None,
    help="Profile whose datasheet peaks are the roofline (GPU: guessed from its name).",
)
@click.option(
    "--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="CPU threads for torch (default on --device cpu: 1, robust on a busy box).",
)
@click.option("--storage-dir", default=None, help="Folder on the NVMe to read a test file from.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    required=True,
    help="Profile to write, e.g. hardware_profiles/measured/NAME.toml.",
)
def measure(
    device: str,
    model_name: str,
    tp: int,
    quick: bool,
    base: str | None,
    dtype: str,
    storage_dir: str | None,
    threads: int | None,
    out: Path,
) -> None:
    """Measure kernel and transfer costs on this machine and write a calibrated profile
    (the default: kvsim calibrate OPTIONS runs this)."""
    shown = Progress()
    if device == "cpu":
        steady_allocator()
    result, profile, paths = run_calibration(
        model_name,
        out,
        device=device,
        tp=tp,
        quick=quick,
        base=base,
        dtype=dtype,
        storage_dir=storage_dir,
        threads=threads,
        log=shown.phase,
        progress=shown.update,
    )
    shown.phase("done")
    click.echo(f"wrote {out} ({profile.name}: {result.measured['device']})")
    click.echo(f"report {paths['report']}")
    for family, (median, worst) in result.held_out_errors().items():
        click.echo(f"  held out {family:<36} median {median:6.1%}  worst {worst:6.1%}")
    errors = result.forward_errors()
    if errors:
        click.echo(
            f"  forward pass (end to end)              median {errors[0]:6.1%}  "
            f"worst {errors[1]:6.1%}"
        )
    for note in result.notes:
        click.echo(f"  {note}")


@calibrate.command("import-vidur")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--model", "model_name", required=True, help="Catalog name or model TOML file.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    required=True,
    help="Profile to write, e.g. hardware_profiles/measured/NAME.toml.",
)
@click.option(
    "--profile",
    "base",
    default=None,
    help="Profile of the GPU Vidur measured, for everything not measured "
    "(default: a100 -> a100-80gb, h100 -> h100-sxm).",
)
@click.option("--gpu", default=None, help="Vidur's GPU folder when FOLDER holds several.")
@click.option("--commit", default=None, help="Vidur commit the CSVs come from (provenance).")
@click.option("--note", default=None, help="A line of provenance to keep with the tables.")
@click.option("--overwrite", is_flag=True, help="Replace the profile already at --out.")
def import_vidur_command(
    folder: Path,
    model_name: str,
    tp: int,
    out: Path,
    base: str | None,
    gpu: str | None,
    commit: str | None,
    note: str | None,
    overwrite: bool,
) -> None:
    """Write a measured profile from Vidur's profiling CSVs (FOLDER: Vidur's data/profiling, or
    a folder holding mlp.csv, attention.csv, all_reduce.csv). Gaps come from the roofline."""
    imported, profile = import_vidur_profile(
        folder,
        model_name,
        tp,
        out,
        base=base,
        gpu=gpu,
        commit=commit,
        note=note,
        overwrite=overwrite,
    )
    click.echo(f"wrote {out} ({profile.name}: {imported.base} + Vidur tables, tp={tp})")
    filled = ", ".join(imported.filled) or "nothing"
    click.echo(f"  filled from the roofline: {filled}")
    for line in imported.notes:
        click.echo(f"  {line}")


def import_vidur_profile(
    folder: Path,
    model_name: str,
    tp: int,
    out: Path,
    *,
    base: str | None = None,
    gpu: str | None = None,
    commit: str | None = None,
    note: str | None = None,
    overwrite: bool = False,
):
    """``kvsim calibrate import-vidur`` as a Python call: (Imported, the validated profile).
    Nothing is written unless the whole profile validates; a profile already at `out` is
    replaced only with `overwrite`. A place that cannot be written is refused before the CSVs
    are read."""
    from kvsim.calibrate.vidur_import import GPU_PROFILES, import_vidur, locate
    from kvsim.hardware import load_profile
    from kvsim.hardware.registry import profile_path
    from kvsim.models import load_model

    if out.suffix != ".toml":
        raise ConfigError(f"--out: expected a .toml path, got {out}")
    _check_out(out, overwrite)
    model = load_model(model_name)
    if base is None:
        base = GPU_PROFILES.get(locate(folder, model, gpu, None).gpu or "")
        if base is None:
            raise ConfigError(
                f"--profile: {folder} does not say which shipped profile its GPU matches "
                f"({', '.join(f'{g} -> {p}' for g, p in GPU_PROFILES.items())}); name one"
            )
    base_profile = load_profile(base)
    base_file = base_profile.source_path or profile_path(base)
    imported = import_vidur(
        folder,
        model,
        tp,
        out,
        base_profile,
        Path(base_file).read_text(encoding="utf-8"),
        gpu=gpu,
        commit=commit,
        note=note,
    )
    return imported, _write_profile(out, imported.text, overwrite)


@calibrate.command("import-aiconfigurator")
@click.option("--gpu", required=True, help="The database's GPU folder, e.g. h100_sxm, b200_sxm.")
@click.option(
    "--engine",
    required=True,
    help="Engine whose kernels were measured: vllm, sglang or trtllm.",
)
@click.option("--model", "model_name", required=True, help="Catalog name or model TOML file.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--kv-dtype", default="bf16", show_default=True, help="bf16 or fp8.")
@click.option("--weight-dtype", default="bf16", show_default=True, help="bf16 or fp8.")
@click.option(
    "--engine-version",
    default=None,
    help="The engine version's tables (default: the newest in the database).",
)
@click.option(
    "--data",
    type=click.Path(path_type=Path),
    default=None,
    help="The aiconfigurator-core wheel or an extracted copy (default: $KVSIM_AICONFIGURATOR, "
    "an installed aiconfigurator_core, else kvsim's subset in benchmarks/data/aiconfigurator).",
)
@click.option(
    "--profile",
    "base",
    default=None,
    help="Profile of the GPU, for everything not measured (default: the GPU's shipped profile).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    required=True,
    help="Profile to write, e.g. hardware_profiles/measured/NAME.toml.",
)
@click.option("--overwrite", is_flag=True, help="Replace the profile already at --out.")
def import_aiconfigurator_command(
    gpu: str,
    engine: str,
    model_name: str,
    tp: int,
    kv_dtype: str,
    weight_dtype: str,
    engine_version: str | None,
    data: Path | None,
    base: str | None,
    out: Path,
    overwrite: bool,
) -> None:
    """Write a measured profile from NVIDIA's AIConfigurator kernel database (GEMM, attention,
    all-reduce measured under vLLM, SGLang or TensorRT-LLM). Gaps come from the roofline."""
    imported, profile = import_aiconfigurator_profile(
        gpu,
        engine,
        model_name,
        tp,
        out,
        kv_dtype=kv_dtype,
        weight_dtype=weight_dtype,
        version=engine_version,
        data=data,
        base=base,
        overwrite=overwrite,
    )
    click.echo(
        f"wrote {out} ({profile.name}: {imported.base} + AIConfigurator tables, {gpu} "
        f"{engine}, tp={tp})"
    )
    click.echo(f"  filled from the roofline: {', '.join(imported.filled) or 'nothing'}")
    for line in imported.notes:
        click.echo(f"  {line}")


def import_aiconfigurator_profile(
    gpu: str,
    engine: str,
    model_name: str,
    tp: int,
    out: Path,
    *,
    kv_dtype: str = "bf16",
    weight_dtype: str = "bf16",
    version: str | None = None,
    data: Path | None = None,
    base: str | None = None,
    overwrite: bool = False,
):
    """``kvsim calibrate import-aiconfigurator`` as a Python call: (Imported, the validated
    profile). Nothing is written unless the whole profile validates."""
    from kvsim.calibrate.aiconfigurator_data import open_database
    from kvsim.calibrate.aiconfigurator_import import (
        GPU_PROFILES,
        Request,
        import_aiconfigurator,
    )
    from kvsim.errors import UnknownNameError
    from kvsim.hardware import load_profile
    from kvsim.hardware.registry import profile_path
    from kvsim.models import load_model

    if out.suffix != ".toml":
        raise ConfigError(f"--out: expected a .toml path, got {out}")
    _check_out(out, overwrite)
    model = load_model(model_name)
    db = open_database(data)
    engines = db.engines(gpu)  # names the GPUs there when --gpu is not among them
    if engine not in engines:
        raise ConfigError(
            f"--engine {engine}: no tables for it on {gpu} in {db.root} (engines there: "
            f"{', '.join(engines) or 'none'})"
        )
    if base is None:
        base = GPU_PROFILES.get(gpu)
        try:
            if base is None:
                raise UnknownNameError("profile", gpu, [])
            profile_path(base)
        except UnknownNameError:
            raise ConfigError(
                f"--gpu {gpu}: kvsim has no base profile for it (expected "
                f"hardware_profiles/{base or gpu}.toml); name one with --profile"
            ) from None
    base_profile = load_profile(base)
    base_file = base_profile.source_path or profile_path(base)
    request = Request(gpu, engine, model, tp, kv_dtype, weight_dtype, version)
    imported = import_aiconfigurator(
        db, request, out, base_profile, Path(base_file).read_text(encoding="utf-8")
    )
    return imported, _write_profile(out, imported.text, overwrite)


def _write_profile(out: Path, text: str, overwrite: bool) -> HardwareProfile:
    """An imported profile written whole, and only once it validates."""
    from kvsim.hardware import validate_profile

    return write_file(
        out, text, what="the profile", overwrite=overwrite, make_parents=True,
        check=validate_profile,
    )  # fmt: skip


def main() -> None:
    """Run ``calibrate`` standalone, printing user errors as one line with exit code 2."""
    import sys

    try:
        calibrate.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except KvsimError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
