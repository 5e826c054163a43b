"""Summaries, table, JSON/CSV and TensorBoard scalars of per-seed results."""
import csv
import io
import json

import numpy as np
import pytest
from scipy import stats as sps
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from evals import report
from prada_jax.jsonio import write_json
from prada_jax.metric_writer import MetricWriter

PER_SEED = {
    "All-SLM": {"accuracy": [0.80, 0.82, 0.79], "latency_mean_s": [1.0, 1.1, 0.9]},
    "All-LLM": {"accuracy": [0.95, 0.96, 0.94], "latency_mean_s": [4.0, 4.4, 3.6]},
}


def test_summary_table_json_csv_tb(tmp_path):
    summ = report.summarize(PER_SEED)
    x = np.array(PER_SEED["All-LLM"]["accuracy"])
    lo, hi = sps.t.interval(0.95, 2, loc=x.mean(), scale=sps.sem(x))
    np.testing.assert_allclose([summ["All-LLM"]["accuracy"].low,
                                summ["All-LLM"]["accuracy"].high], [lo, hi], rtol=1e-9)
    text = report.format_table(summ, title="synthetic")
    lines = text.splitlines()
    assert lines[0] == "synthetic" and lines[1].startswith("policy")
    assert lines[3].startswith("All-SLM") and lines[4].startswith("All-LLM")
    assert "0.950 ±" in lines[4]

    data = report.to_json_dict(PER_SEED, summ, extra={"synthetic": True})
    path = write_json(tmp_path / "r.json", data)
    back = json.loads(path.read_text())
    assert back["synthetic"] is True
    assert back["policies"]["All-SLM"]["accuracy"]["per_seed"] == [0.80, 0.82, 0.79]
    np.testing.assert_allclose(back["policies"]["All-LLM"]["accuracy"]["ci_low"], lo)

    rows = list(csv.DictReader(io.StringIO(report.csv_text(summ, {"M": 4}))))
    assert len(rows) == 4 and rows[0]["M"] == "4" and rows[0]["policy"] == "All-SLM"
    np.testing.assert_allclose(float(rows[2]["mean"]), x.mean())

    ratio = report.ratios(PER_SEED, "All-SLM", "All-LLM")
    r = np.array(PER_SEED["All-SLM"]["accuracy"]) / x
    np.testing.assert_allclose(ratio["accuracy"].mean, r.mean())

    with MetricWriter(tmp_path / "tb", enabled=True) as w:
        w.write_scalars(0, report.tb_scalars(summ))
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    vals = acc.Scalars("eval/All-LLM/accuracy")
    np.testing.assert_allclose(vals[0].value, x.mean(), rtol=1e-6)


def test_tb_scalars_leave_out_undefined_values():
    from prada_jax.stats import mean_ci
    summ = {"All-SLM": {"accuracy": mean_ci([0.8, 0.9]), "latency_s": mean_ci([np.nan, np.nan])},
            "PRADA": {"accuracy": mean_ci([0.85])}}
    sc = report.tb_scalars(summ)
    assert sc["eval/All-SLM/accuracy"] == pytest.approx(0.85)
    assert "eval/All-SLM/latency_s" not in sc and "eval/All-SLM/latency_s_ci95" not in sc
    assert sc["eval/PRADA/accuracy"] == pytest.approx(0.85)
    assert "eval/PRADA/accuracy_ci95" not in sc      # one seed: no interval
    assert all(np.isfinite(v) for v in sc.values())


def test_u_binding_and_link_binding_are_flagged():
    """A row that lost more than BLOCKED_TOL of its arrivals to a full population is flagged
    ``U binds``; one whose uplink was over-asked in more than LINK_TOL of its slots ``link
    binds``; a row below both is not."""
    from evals import report
    from prada_jax import stats
    ok = {"rho": stats.mean_ci([0.5, 0.5]), "blocked_rate": stats.mean_ci([0.0, 0.0005]),
          "uplink_bound_share": stats.mean_ci([0.0, 0.0])}
    assert report.row_flags(ok) == []
    full = dict(ok, blocked_rate=stats.mean_ci([0.01, 0.03]))
    assert report.U_BINDS in report.row_flags(full)
    link = dict(ok, uplink_bound_share=stats.mean_ci([0.05, 0.02]))
    assert report.row_flags(link) == [report.LINK_BINDS]
