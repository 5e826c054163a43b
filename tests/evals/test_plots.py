"""Figures are written as valid PNGs and read back for TensorBoard."""
import numpy as np

from evals import plots


def test_figures_are_valid_pngs(tmp_path):
    x = [8, 1, 2, 4]
    m = np.array([1.0, 3.0, 2.0, 1.2])
    band = (m, m - 0.1, m + 0.1)
    p1 = plots.plot_curves(x, {"PRADA": band, "All-LLM": (m + 1, m + 0.8, m + 1.3)},
                           xlabel="server capacity M", ylabel="latency (s)", title="t",
                           path=tmp_path / "a.png", knee=4)
    comps = {"processing": band, "communication": (m / 2, m / 2 - 0.1, m / 2 + 0.1),
             "queueing": (m / 4, m / 4, m / 4)}
    p2 = plots.plot_stacked_delays(x, comps, xlabel="M", title="t", path=tmp_path / "b.png",
                                   total=(m * 1.75, m * 1.7, m * 1.8), knee=2)
    p3 = plots.plot_bars(["a", "b"], ([0.5, 0.7], [0.4, 0.6], [0.6, 0.8]), ylabel="acc",
                         title="t", path=tmp_path / "c.png")
    rel = {"mean_pred": [0.05, None, 0.5], "frac_pos": [0.1, None, 0.4], "count": [3, 0, 2],
           "ece": 0.05, "auc": 0.7}
    p4 = plots.plot_reliability({"gsm8k": rel}, tmp_path / "d.png")
    for p in (p1, p2, p3, p4):
        assert plots.is_valid_png(p), p
        img = plots.png_to_rgb(p)
        assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
    (tmp_path / "bad.png").write_bytes(b"not a png")
    assert not plots.is_valid_png(tmp_path / "bad.png")
    assert not plots.is_valid_png(tmp_path / "missing.png")
