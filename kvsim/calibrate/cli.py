"""`kvsim calibrate`: measure this machine and write a profile with measured tables.

PyTorch is an optional extra (``pip install 'kvsim[calibrate]'``); it is imported only when the
command runs, so the rest of kvsim never needs it.
"""

from __future__ import annotations

from pathlib import Path

import click

from kvsim.errors import ConfigError, KvsimError

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
):
    """The whole pipeline as a Python call: measure, write the profile and its report, load the
    profile back through validation. Returns (Calibration, HardwareProfile, report paths)."""
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
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profile_toml(result.profile), encoding="utf-8")
    profile = validate_profile(out)
    paths = write_report(result, model, out)
    return result, profile, paths


@click.command("calibrate")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True)
@click.option("--model", "model_name", required=True, help="Catalog name or model TOML file.")
@click.option(
    "--tp",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Tensor-parallel degree: kernels are timed at one rank's shapes.",
)
@click.option("--quick", is_flag=True, help="Smaller sweep (CPU: seconds; GPU: < 5 minutes).")
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
def calibrate(
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
    """Measure kernel and transfer costs on this machine and write a calibrated profile."""
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
        log=lambda msg: click.echo(f"  {msg}", err=True),
    )
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
