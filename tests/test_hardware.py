"""Hardware profiles: shipped files match hardware.md; bad files fail naming file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsim.errors import ConfigError, UnknownNameError
from kvsim.hardware import (
    TIER_NAMES,
    load_profile,
    parse_duration,
    profile_names,
    profiles_dir,
    validate_profile,
    with_overrides,
)
from kvsim.hardware.show import format_profile, format_profile_list

SHIPPED = [
    "a100-80gb", "b200", "b300", "gb200", "gb300", "h100-sxm", "h200-sxm", "l40s", "mi300x",
    "rtx-pro-6000",
]  # fmt: skip
# measured profiles shipped in hardware_profiles/measured/ (tests/test_import_vidur.py checks them)
MEASURED = ["measured/a100-80gb-vidur-llama-2-70b-tp2"]
H100_TEXT = (profiles_dir() / "h100-sxm.toml").read_text()


@pytest.fixture(autouse=True)
def _shipped_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSIM_PROFILES", raising=False)


def test_shipped_profile_names() -> None:
    assert profile_names() == sorted(SHIPPED + MEASURED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_validates(name: str) -> None:
    p = load_profile(name)
    assert p.name == name
    assert [t.name for t in p.tiers] == list(TIER_NAMES)
    assert [t.name for t in p.enabled_tiers] == ["hbm", "dram"]
    assert p.tier("hbm").capacity_bytes == p.gpus_per_node * p.gpu.hbm_bytes
    assert p.tier("nvme").path in ("gds", "bounce")
    assert p.tier("rdma").shared_by_nodes > 1 and p.tier("pfs").shared_by_nodes > 1
    assert all(t.shared_by_nodes == 1 for t in p.tiers if t.name not in ("rdma", "pfs"))
    assert 0 < p.efficiency.compute <= 1 and 0 < p.efficiency.memory <= 1
    for field, text in p.sources.items():
        assert text.startswith(("S", "assumption:", "measured:")), field


def test_h100_matches_hardware_md() -> None:
    p = load_profile("h100-sxm")
    assert p.gpu.hbm_bytes == 80 * 10**9
    assert p.gpu.hbm_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert p.gpu.peak_flops_per_s["bf16"] == pytest.approx(989.4e12)
    assert p.gpu.peak_flops_per_s["fp8"] == pytest.approx(1978.9e12)
    assert p.gpus_per_node == 8
    assert p.tier("dram").capacity_bytes == 2 * 10**12
    # DMA copies, not hardware.md's SM-copy 35 GB/s (issue 11; tests/test_tier_fidelity.py)
    assert p.tier("dram").read_bandwidth_bytes_per_s == pytest.approx(52.4e9)
    assert p.tier("dram").transfer_overhead_s == pytest.approx(3.5e-6)
    assert p.tier("dram").bandwidth_scope == "per_gpu"
    assert p.tier("rdma").latency_s == pytest.approx(8e-6)
    assert p.sources["gpu.hbm_bandwidth"].startswith("S1 ")


def test_h200_matches_hardware_md() -> None:
    p = load_profile("h200-sxm")
    assert p.gpu.hbm_bytes == 141 * 10**9
    assert p.gpu.hbm_bandwidth_bytes_per_s == pytest.approx(4.8e12)
    assert p.gpu.peak_flops_per_s["bf16"] == pytest.approx(989.4e12)
    # hardware.md's H200 measurements: 770–800 of 989.4 TFLOP/s; ≈ 4.3 of 4.8 TB/s
    assert 770 / 989.4 <= p.efficiency.compute <= 800 / 989.4
    assert p.efficiency.memory == pytest.approx(4.3 / 4.8, abs=0.01)
    assert p.sources["efficiency.compute"].startswith("measured:")


def test_other_gpus_match_hardware_md() -> None:
    a100, b200 = load_profile("a100-80gb"), load_profile("b200")
    gb200, mi300x = load_profile("gb200"), load_profile("mi300x")
    assert a100.gpu.hbm_bandwidth_bytes_per_s == pytest.approx(2039e9)
    assert a100.gpu.peak_flops_per_s == {"bf16": pytest.approx(312e12)}
    assert b200.gpu.hbm_bytes == 180 * 10**9 and b200.gpu.peak_flops_per_s["bf16"] == 2250e12
    assert gb200.gpus_per_node == 4 and gb200.gpu.hbm_bytes == 186 * 10**9
    assert gb200.tier("dram").capacity_bytes == 1_870 * 10**9
    assert mi300x.gpu.hbm_bytes == 192 * 10**9
    assert mi300x.gpu.hbm_bandwidth_bytes_per_s == pytest.approx(5.3e12)
    assert mi300x.gpu.peak_flops_per_s["fp8"] == pytest.approx(2614.9e12)


def test_load_by_path_and_validate_same_profile() -> None:
    path = profiles_dir() / "h100-sxm.toml"
    assert load_profile(str(path)) == validate_profile(path)


def test_unknown_profile_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_profile("h100-pcie")
    assert info.value.valid == sorted(SHIPPED + MEASURED)
    assert "h100-pcie" in str(info.value) and "h200-sxm" in str(info.value)


def test_env_var_and_measured_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "measured").mkdir()
    (tmp_path / "mine.toml").write_text(H100_TEXT)
    (tmp_path / "measured" / "h100-sxm.toml").write_text(H100_TEXT)
    monkeypatch.setenv("KVSIM_PROFILES", str(tmp_path))
    assert profile_names() == ["measured/h100-sxm", "mine"]
    assert load_profile("measured/h100-sxm").source_path == tmp_path / "measured" / "h100-sxm.toml"
    with pytest.raises(UnknownNameError):
        load_profile("h100-sxm")


# --- overrides ---------------------------------------------------------------------------


def test_overrides_enable_exactly_the_listed_tiers() -> None:
    base = load_profile("h100-sxm")
    p = with_overrides(base, tiers=["cxl", "nvme"])
    assert [t.name for t in p.enabled_tiers] == ["hbm", "cxl", "nvme"]
    assert [t.name for t in base.enabled_tiers] == ["hbm", "dram"]  # the original is untouched


def test_overrides_resize_tiers_and_record_the_source() -> None:
    base = load_profile("h100-sxm")
    p = with_overrides(base, capacities={"dram": "1TiB", "rdma": "100TB"})
    assert p.tier("dram").capacity_bytes == 2**40
    assert p.tier("rdma").capacity_bytes == 100 * 10**12
    assert p.tier("dram").enabled and not p.tier("rdma").enabled  # capacities alone keep flags
    assert p.sources["tiers.dram.capacity"] == "override: dram=1TiB"
    assert base.tier("dram").capacity_bytes == 2 * 10**12


def test_overrides_reject_unknown_tiers_and_bad_sizes() -> None:
    base = load_profile("h100-sxm")
    with pytest.raises(UnknownNameError, match="tape"):
        with_overrides(base, tiers=["tape"])
    with pytest.raises(UnknownNameError, match="tape"):
        with_overrides(base, capacities={"tape": "1TB"})
    with pytest.raises(ConfigError, match="dram=lots"):
        with_overrides(base, capacities={"dram": "lots"})
    with pytest.raises(ConfigError, match="dram=0GB"):
        with_overrides(base, capacities={"dram": "0GB"})


# --- validation --------------------------------------------------------------------------


def _write_bad(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    text = H100_TEXT
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return path


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        validate_profile(path)
    message = str(info.value)
    assert "bad.toml: " in message and "\n" not in message
    return message


NVME_READ = 'read_bandwidth = "50.4GB/s"'
PFS_NAME = 'name = "pfs"'


@pytest.mark.parametrize(
    ("edits", "expected"),
    [
        pytest.param(
            [('hbm_bandwidth = "3.35TB/s"\n', "")],
            "gpu.hbm_bandwidth: missing required field",
            id="missing-field",
        ),
        pytest.param(
            [("[efficiency]\n", "[efficiency_typo]\n")],
            "efficiency_typo: unknown field",
            id="unknown-field",
        ),
        pytest.param(
            [(NVME_READ, 'read_bandwidth = "0GB/s"')],
            "tiers.nvme.read_bandwidth: expected a positive bandwidth such as '12GB/s', "
            "got '0GB/s'",
            id="zero-bandwidth",
        ),
        pytest.param(
            [(NVME_READ, 'read_bandwidth = "-5GB/s"')],
            "tiers.nvme.read_bandwidth: expected a positive bandwidth",
            id="negative-bandwidth",
        ),
        pytest.param(
            [(NVME_READ, 'read_bandwidth = "fast"')],
            "tiers.nvme.read_bandwidth: expected a positive bandwidth",
            id="non-numeric-bandwidth",
        ),
        pytest.param(
            [(NVME_READ, "read_bandwidth = 56e9")],
            "tiers.nvme.read_bandwidth: expected a positive bandwidth",
            id="bandwidth-without-unit",
        ),
        pytest.param(
            [('capacity = "2TB"', 'capacity = "2048"')],
            "tiers.dram.capacity: expected a positive size with a unit",
            id="capacity-without-unit",
        ),
        pytest.param(
            [('capacity = "2TB"', "capacity = 2048")],
            "tiers.dram.capacity: expected a positive size with a unit",
            id="capacity-bare-number",
        ),
        pytest.param(
            [('capacity = "2TB"', 'capacity = "-2TB"')],
            "tiers.dram.capacity: expected a positive size with a unit",
            id="capacity-negative",
        ),
        pytest.param(
            [('capacity = "640GB"', 'capacity = "600GB"')],
            "tiers.hbm.capacity: expected gpus_per_node × gpu.hbm",
            id="hbm-capacity-mismatch",
        ),
        pytest.param(
            [('latency = "100us"', 'latency = "100"')],
            "tiers.nvme.latency: expected a duration with a unit",
            id="latency-without-unit",
        ),
        pytest.param(
            [('name = "cxl"', 'name = "tape"')],
            "tiers[2].name: expected one of ['hbm', 'dram', 'cxl', 'nvme', 'rdma', 'pfs'], "
            "got 'tape'",
            id="unknown-tier",
        ),
        pytest.param(
            [('name = "cxl"', 'name = "dram"')],
            "tiers.dram: duplicate tier",
            id="duplicate-tier",
        ),
        pytest.param(
            [
                ('name = "cxl"', PFS_NAME),
                ('name = "pfs"\ncapacity = "1PB"', 'name = "cxl"\ncapacity = "1PB"'),
            ],
            "tiers.nvme: tiers out of order",
            id="tiers-out-of-order",
        ),
        pytest.param(
            [('name = "hbm"', 'name = "dram_x"')],
            "tiers[0].name: expected one of",
            id="hbm-renamed",
        ),
        pytest.param(
            [("faster_than_above_note = ", "# faster_than_above_note = ")],
            "tiers.rdma.read_bandwidth: faster than the tier above ('nvme')",
            id="faster-without-note",
        ),
        pytest.param(
            [('path = "gds"', 'path = "tape"')],
            "tiers.nvme.path: expected 'gds' or 'bounce'",
            id="bad-nvme-path",
        ),
        pytest.param(
            [('bandwidth_scope = "per_node"', 'bandwidth_scope = "per_rack"')],
            "tiers.cxl.bandwidth_scope: expected 'per_gpu' or 'per_node'",
            id="bad-scope",
        ),
        pytest.param(
            [("compute = 0.76", "compute = 1.2")],
            "efficiency.compute: expected a number in (0, 1], got 1.2",
            id="efficiency-above-one",
        ),
        pytest.param(
            [("memory = 0.9", "memory = 0")],
            "efficiency.memory: expected a number in (0, 1], got 0",
            id="efficiency-zero",
        ),
        pytest.param(
            [("compute = 0.76", 'compute = "high"')],
            "efficiency.compute: expected a number in (0, 1]",
            id="efficiency-non-numeric",
        ),
        pytest.param(
            [("gpu_memory_utilization = 0.9", "gpu_memory_utilization = 90")],
            "gpu_memory_utilization: expected a number in (0, 1]",
            id="utilization-percent",
        ),
        pytest.param(
            [("gpus_per_node = 8", "gpus_per_node = 0")],
            "gpus_per_node: expected a positive integer",
            id="zero-gpus",
        ),
        pytest.param(
            [("bf16 = 989.4e12", "bf16 = -1.0")],
            "gpu.flops.bf16: expected a number >= 0",
            id="negative-flops",
        ),
        pytest.param(
            [('"tiers.nvme.latency" = ', '"unused.nvme.latency" = ')],
            "sources.unused.nvme.latency: no such numeric field",
            id="source-for-unknown-field",
        ),
        pytest.param(
            [('"tiers.nvme.latency" = ', '# "tiers.nvme.latency" = ')],
            "tiers.nvme.latency: no entry in [sources]",
            id="number-without-source",
        ),
        pytest.param(
            [('"S1 glennklockwood H100: 3.35 TB/s"', '"glennklockwood says so"')],
            "sources.gpu.hbm_bandwidth: expected text starting with a source id",
            id="source-without-id",
        ),
        pytest.param(
            [("gpus_per_node = 8\n", "gpus_per_node = 8\nthis is not toml\n")],
            "invalid TOML",
            id="malformed-toml",
        ),
    ],
)
def test_bad_profile_names_file_and_field(
    tmp_path: Path, edits: list[tuple[str, str]], expected: str
) -> None:
    assert expected in _error(_write_bad(tmp_path, *edits))


def test_malformed_toml_reports_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\n\nthis is not toml\n')
    assert "(at line 3, column" in _error(path)


def test_note_allows_a_faster_lower_tier(tmp_path: Path) -> None:
    path = _write_bad(tmp_path, (NVME_READ, 'read_bandwidth = "200GB/s"'))
    assert "tiers.nvme.read_bandwidth: faster than the tier above ('cxl')" in _error(path)
    note = 'read_bandwidth = "200GB/s"\nfaster_than_above_note = "a RAID of many drives"'
    p = validate_profile(_write_bad(tmp_path, (NVME_READ, note)))
    assert p.tier("nvme").faster_than_above_note == "a RAID of many drives"


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: no such profile file"):
        load_profile(str(tmp_path / "nope.toml"))


def test_a_subset_of_tiers_is_valid(tmp_path: Path) -> None:
    start = H100_TEXT.index('[[tiers]]\nname = "cxl"')
    end = H100_TEXT.index('[[tiers]]\nname = "nvme"')
    text = H100_TEXT[:start] + H100_TEXT[end:]
    text = "\n".join(line for line in text.splitlines() if not line.startswith('"tiers.cxl.'))
    path = tmp_path / "no-cxl.toml"
    path.write_text(text)
    assert [t.name for t in validate_profile(path).tiers] == ["hbm", "dram", "nvme", "rdma", "pfs"]


# --- durations and text views -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3us", 3e-6), ("140ns", 140e-9), ("0.1ms", 1e-4), ("2s", 2.0), ("5 µs", 5e-6), (0.5, 0.5)],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["3", "3 parsecs", "-1us", "us", True])
def test_parse_duration_rejects(text: str | bool) -> None:
    with pytest.raises(ConfigError, match="latency"):
        parse_duration(text, "latency")


def test_format_profile_list_has_one_line_per_profile() -> None:
    lines = format_profile_list().splitlines()
    assert len(lines) == 1 + len(SHIPPED) + len(MEASURED)
    h200 = next(line for line in lines if line.startswith("h200-sxm"))
    assert "H200 SXM" in h200 and "141 GB" in h200 and "6.31" in h200


def test_format_profile_shows_tiers_flags_and_sources() -> None:
    text = format_profile(load_profile("h100-sxm"))
    assert "3.35 TB/s" in text and "989.4 TFLOP/s" in text
    assert "S1 glennklockwood H100: 3.35 TB/s" in text
    nvme = next(line for line in text.splitlines() if line.startswith("nvme "))
    assert " off " in nvme and "30.72 TB" in nvme and "gds" in nvme
    dram = next(line for line in text.splitlines() if line.startswith("dram "))
    assert " on " in dram and "per GPU" in dram
    assert "tiers.rdma: faster than the tier above" in text
