"""benchmarks/pd_vs_aggregated.py: its attainment, GPU counts, crossover and DistServe accounting.

Small runs only (a few dozen requests on OPT-13B); the sweep itself is the benchmark's business.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "pd_vs_aggregated.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pd_vs_aggregated", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pd_vs_aggregated"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


pva = _load()
CHAT = pva.APPS[0]


def _job(mode_label: str, rate: float = 2.0, per_gpu: int = 8) -> object:
    mode = next(m for m in CHAT.modes if m.label == mode_label)
    return pva.Job(CHAT, mode, rate, per_gpu)


def test_every_mode_of_every_app_gets_the_apps_gpus() -> None:
    for app in pva.APPS:
        for mode in app.modes:
            config = pva.config_of(pva.Job(app, mode, app.rates[0], 1))
            assert pva.gpus_of(config) == app.gpus, (app.name, mode.label)
            assert config.tp == app.tp
            assert bool(config.pd) == (mode.pd is not None)


def test_pd_and_aggregated_runs_occupy_the_same_gpus() -> None:
    """The replicas a run reports, times TP, are the app's GPUs in both modes."""
    aggregated = next(m for m in CHAT.modes if m.pd is None)
    split = next(m for m in CHAT.modes if m.pd is not None)
    counts = {}
    for mode in (aggregated, split):
        _, summary, _, gpus = pva.simulate_job(pva.Job(CHAT, mode, 1.0, 4))
        replicas = summary["per_replica"]
        counts[mode.label] = len(replicas) * CHAT.tp
        assert gpus == CHAT.gpus
        if mode.pd:
            roles = [r["role"] for r in replicas]
            assert (roles.count("prefill"), roles.count("decode")) == mode.pd
    assert set(counts.values()) == {CHAT.gpus}


def test_attainment_equals_a_hand_count_of_the_requests_table() -> None:
    table, summary, _, _ = pva.simulate_job(_job("P/D 2:1", rate=3.0, per_gpu=10))
    rows = table.to_pylist()
    for ttft_s, tpot_s in ((CHAT.ttft_s, CHAT.tpot_s), (0.1, 0.03), (None, 0.03), (0.1, None)):
        count = 0
        for row in rows:
            ok = row["status"] == "completed"
            if ok and ttft_s is not None:
                ok = row["ttft_s"] <= ttft_s
            tpot = row["tpot_s"]
            if ok and tpot_s is not None and tpot is not None and not math.isnan(tpot):
                ok = tpot <= tpot_s
            count += ok
        assert pva.attainment(table, ttft_s, tpot_s) == count / len(rows)
    # and it is the summary's figure at the app's SLOs
    assert pva.attainment(table, CHAT.ttft_s, CHAT.tpot_s) == summary["slo_attainment"]
    # a bound no request meets, and one every completed request meets
    assert pva.attainment(table, 1e-9, None) == 0.0
    done = sum(r["status"] == "completed" for r in rows) / len(rows)
    assert pva.attainment(table, 1e9, 1e9) == done


def test_distserve_accounting_moves_the_first_token_to_the_prefill_end() -> None:
    table, _, ends, _ = pva.simulate_job(_job("P/D 1:2", rate=2.0, per_gpu=6))
    arrival = table.column("arrival_s").to_numpy()
    first = table.column("first_token_s").to_numpy()
    finish = table.column("finish_s").to_numpy()
    output = table.column("output_tokens").to_numpy()
    assert len(ends.ends) == table.num_rows  # every request was handed off
    end = np.array([ends.ends[i] for i in range(table.num_rows)])
    assert np.all(arrival <= end) and np.all(end <= first)
    ttft, tpot = ends.distserve_view(table)
    np.testing.assert_allclose(ttft, end - arrival)
    many = output > 1
    np.testing.assert_allclose(tpot[many], (finish[many] - end[many]) / (output[many] - 1))
    assert np.all(ttft <= table.column("ttft_s").to_numpy())


def test_distserve_accounting_leaves_aggregated_runs_alone() -> None:
    table, _, ends, _ = pva.simulate_job(_job("aggregated, kvsim default settings"))
    assert ends.ends == {}
    ttft, tpot = ends.distserve_view(table)
    np.testing.assert_array_equal(ttft, table.column("ttft_s").to_numpy())
    np.testing.assert_array_equal(tpot, table.column("tpot_s").to_numpy())


def test_rate_at_interpolates_where_attainment_falls_through_the_target() -> None:
    rates = [1.0, 2.0, 3.0, 4.0]
    assert pva.rate_at(rates, [1.0, 0.95, 0.85, 0.5], 0.9) == pytest.approx(2.5)
    assert pva.rate_at(rates, [1.0, 1.0, 0.9, 0.2], 0.9) == pytest.approx(3.0)
    assert pva.rate_at(rates, [0.5, 0.4, 0.3, 0.2], 0.9) == 0.0
    assert pva.rate_at(rates, [1.0, 1.0, 1.0, 0.95], 0.9) == 4.0  # a lower bound


def test_goodput_cell_says_when_the_sweep_does_not_bracket_90_percent() -> None:
    rates = [1.0, 2.0, 3.0]
    assert pva.goodput_cell(rates, [1.0, 0.95, 0.85]) == "2.500"
    assert pva.goodput_cell(rates, [0.8, 0.5, 0.1]) == "< 1"
    assert pva.goodput_cell(rates, [1.0, 0.99, 0.95]) == ">= 3"


def test_crossover_is_the_first_rate_from_which_pd_stays_above() -> None:
    rates = [1.0, 2.0, 3.0, 4.0]
    assert pva.crossover(rates, [0.5, 0.9, 0.8, 0.7], [1.0, 0.8, 0.6, 0.2]) == "2"
    assert pva.crossover(rates, [0.9, 0.5, 0.8, 0.7], [0.8, 0.8, 0.6, 0.2]) == "3"
    assert pva.crossover(rates, [0.5, 0.5, 0.5, 0.5], [0.6, 0.6, 0.6, 0.6]) == "never"
    assert pva.crossover(rates, [0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]) == "never"


def test_crossover_needs_a_margin_and_ignores_overload() -> None:
    rates = [1.0, 2.0, 3.0, 4.0]
    # 100 % against 99.5 % is a tie, not a crossover
    assert pva.crossover(rates, [1.0, 1.0, 0.2, 0.1], [0.995, 0.995, 0.9, 0.5]) == "never"
    # 5 % against 3 % where both are swamped is no crossover either
    assert pva.crossover(rates, [0.9, 0.3, 0.05, 0.04], [1.0, 0.6, 0.03, 0.02]) == "never"
    # and points where both are swamped do not undo one inside the useful range
    assert pva.crossover(rates, [0.9, 0.8, 0.02, 0.01], [0.8, 0.7, 0.03, 0.02]) == "1"
    # P/D falling below 50 % while aggregated still serves is not skipped
    assert pva.crossover(rates, [1.0, 0.3, 0.1, 0.05], [0.9, 0.9, 0.4, 0.1]) == "never"


def test_lengths_follow_distserves_rules_and_the_seed() -> None:
    prompt, output = pva.lengths("longbench", 500, seed=3)
    assert np.all(prompt == np.minimum(2040 - output, prompt))
    assert prompt.min() >= 2040 - 512 and prompt.max() <= 2040
    assert np.all((output >= 2) & (output <= 512))
    chat_prompt, chat_output = pva.lengths("sharegpt", 500, seed=3)
    assert np.all(chat_prompt + chat_output < 2048)
    again = pva.lengths("sharegpt", 500, seed=3)
    np.testing.assert_array_equal(again[0], chat_prompt)
    np.testing.assert_array_equal(again[1], chat_output)


def test_tables_and_doc_block_round_trip(tmp_path: Path) -> None:
    """The Markdown block goes between the markers and nowhere else."""
    app = dataclasses.replace(CHAT, rates=(1.0, CHAT.scale_rate))
    points = [pva.run(pva.Job(app, mode, rate, 3)) for mode in app.modes for rate in app.rates]
    text = pva.tables([app], points)
    assert text.count("| P/D 2:1 |") >= 2 and "DistServe's TTFT" in text
    doc = tmp_path / "d.md"
    doc.write_text(f"before\n{pva.DOC_BEGIN}\nold\n{pva.DOC_END}\nafter\n", encoding="utf-8")
    pva.update_doc(text, doc)
    new = doc.read_text(encoding="utf-8")
    assert new.startswith("before\n") and new.endswith(f"{pva.DOC_END}\nafter\n")
    assert "old" not in new and text in new
    # another engine's run writes its own block and leaves the default one alone
    begin, end = pva.markers("vllm@0.6")
    doc.write_text(f"{pva.DOC_BEGIN}\nA\n{pva.DOC_END}\n{begin}\nB\n{end}\n", encoding="utf-8")
    pva.update_doc("C", doc, engine="vllm@0.6")
    assert doc.read_text(encoding="utf-8") == (
        f"{pva.DOC_BEGIN}\nA\n{pva.DOC_END}\n{begin}\n\nC\n{end}\n"
    )


def test_pd_hand_off_does_not_wait_for_an_idle_decode_replica_without_chunked_prefill() -> None:
    """With chunked prefill off, a decode replica once admitted a pulled request only in an
    iteration with nothing else scheduled (Scheduler._admit applied the whole-prompt rule to a
    pull, which computes no tokens): hand-offs waited seconds. The median wait from prefill end
    to first token must not depend on the setting."""
    waits = []
    for mode in pva.CHECK_MODES:
        table, _, ends, _ = pva.simulate_job(pva.Job(CHAT, mode, 1.0, 10))
        ttft, _ = ends.distserve_view(table)
        waits.append(float(np.median(table.column("ttft_s").to_numpy() - ttft)))
    off, on = waits
    assert off <= 2 * on + 0.05
