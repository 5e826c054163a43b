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


def test_knee_label_inside_axes_and_legend_off_the_data(tmp_path, monkeypatch):
    """The knee label stays inside the axes wherever the knee is (left edge, right edge); the
    legend sits outside the axes; the delay axis says what it averages."""
    checked = []
    save = plots._save

    def check(fig, path):
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        ax = fig.axes[0]
        box = ax.get_window_extent(r)
        for t in ax.texts:
            tb = t.get_window_extent(r)
            assert box.x0 - 0.5 <= tb.x0 and tb.x1 <= box.x1 + 0.5, (t.get_text(), tb, box)
            assert box.y0 <= tb.y0 and tb.y1 <= box.y1 + 0.5, (t.get_text(), tb, box)
        leg = ax.get_legend()
        if leg is not None:
            assert leg.get_window_extent(r).x0 >= box.x1, "legend overlaps the axes"
        checked.append((path, len(ax.texts), ax.get_ylabel()))
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", check)
    x = [0.25, 0.5, 1, 2, 5, 10, 20]
    m = np.linspace(0.9, 0.97, 7)
    comps = {"processing": (m, m - 0.01, m + 0.01), "communication": (m / 9, m / 10, m / 8)}
    for knee in (0.25, 20):
        plots.plot_stacked_delays(x, comps, xlabel="B (MHz)", title="t", knee=knee,
                                  path=tmp_path / f"d{knee}.png", total=(m, m - .02, m + .02))
        plots.plot_curves(x, {"a": (m, m - .01, m + .01)}, xlabel="B", ylabel="acc", title="t",
                          knee=knee, knee_label="knee", path=tmp_path / f"c{knee}.png")
    plots.plot_delay_split_bars(["a", "b"], {"processing": [1.0, 2.0]}, title="t",
                                path=tmp_path / "s.png")
    assert len(checked) == 5 and all(n == 1 for _, n, _ in checked[:4])
    delay_labels = {lab for p, _, lab in checked if p.name.startswith(("d", "s"))}
    assert delay_labels == {"mean delay per finished user (s)"}
