"""Matplotlib figures of the evals (headless Agg backend): curves with CI bands, stacked delays,
reliability diagrams, and their conversion to RGB arrays for TensorBoard.

Every function takes plain arrays (means and CI bounds over seeds) and a path, writes one PNG
and returns the path. Axes are monotone: grids are sorted, ticks sit on the grid values, and a
grid spanning more than a factor of 8 with positive values is drawn on a log2 axis.
"""
from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

# Band = (mean [G], low [G], high [G]).
Band = tuple[Sequence[float], Sequence[float], Sequence[float]]

_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#17becf", "#bcbd22"]
DELAY_COLORS = {"processing": "#4c72b0", "communication": "#dd8452", "queueing": "#c44e52"}


def _setup_x(ax, x: np.ndarray, xlabel: str) -> None:
    xs = np.unique(x)
    if xs.size >= 2 and xs.min() > 0 and xs.max() / xs.min() > 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{v:g}" for v in xs])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.grid(True, alpha=0.3)


def _sorted(x, *arrays):
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x)
    return (x[order],) + tuple(np.asarray(a, dtype=np.float64)[order] for a in arrays)


def _title(ax, text: str) -> None:
    ax.set_title("\n".join(textwrap.wrap(text, 70)), fontsize=8)


DELAY_YLABEL = "mean delay per finished user (s)"   # averages every finished user, solved or not


def _knee(ax, knee: float, label: str) -> None:
    """Dashed line at the knee with its label inside the axes: right of the line in the left
    half of the plot, left of it in the right half (never past the figure edge). Call after
    the x axis is set up."""
    ax.axvline(knee, color="k", ls="--", lw=1)
    frac = ax.transAxes.inverted().transform(ax.transData.transform((knee, 0.0)))[0]
    right = frac > 0.5
    ax.text(knee, 0.98, f"{label} = {knee:g} " if right else f" {label} = {knee:g}",
            transform=ax.get_xaxis_transform(), va="top", ha="right" if right else "left",
            fontsize=8, bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))


def _legend_outside(ax) -> None:
    """Legend to the right of the axes, so it never covers data."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def _save(fig, path: os.PathLike | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png", bbox_inches="tight")
    plt.close(fig)
    return path


def plot_curves(x: Sequence[float], series: Mapping[str, Band], *, xlabel: str, ylabel: str,
                title: str, path: os.PathLike | str, knee: float | None = None,
                knee_label: str = "knee") -> Path:
    """One line per policy with its 95% CI band; an optional dashed vertical line at the knee.

    Args:
      x: [G] grid values (any order; sorted here).
      series: policy name -> (mean [G], low [G], high [G]).
    """
    fig, ax = plt.subplots(figsize=(6.6, 3.8))
    for i, (name, (m, lo, hi)) in enumerate(series.items()):
        xs, m, lo, hi = _sorted(x, m, lo, hi)
        color = _COLORS[i % len(_COLORS)]
        ax.plot(xs, m, marker="o", ms=3.5, color=color, label=name)
        lo = np.where(np.isfinite(lo), lo, m)
        hi = np.where(np.isfinite(hi), hi, m)
        ax.fill_between(xs, lo, hi, color=color, alpha=0.18, linewidth=0)
    _setup_x(ax, np.asarray(x, dtype=np.float64), xlabel)
    if knee is not None:
        _knee(ax, knee, knee_label)
    ax.set_ylabel(ylabel)
    _title(ax, title)
    _legend_outside(ax)
    return _save(fig, path)


def plot_panels(x: Sequence[float], panels: Mapping[str, Mapping[str, Band]], *, xlabel: str,
                title: str, path: os.PathLike | str, vline: float | None = None,
                vline_label: str = "", hlines: Mapping[str, float] | None = None,
                ncols: int = 3) -> Path:
    """A grid of curve panels sharing one x grid and one legend (the load curve).

    Args:
      x: [G] grid values.
      panels: y label -> {policy: (mean [G], low [G], high [G])}; NaN means are gaps (e.g. a
        withheld latency).
      vline: optional x of a dashed vertical line in every panel (e.g. the crossover).
      hlines: optional y label -> y of a dotted horizontal line in that panel (e.g. ρ = 1).
    """
    names = list(panels)
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.1 * nrows), squeeze=False)
    policies = list(dict.fromkeys(p for ser in panels.values() for p in ser))
    colors = {p: _COLORS[i % len(_COLORS)] for i, p in enumerate(policies)}
    for ax, ylabel in zip(axes.flat, names):
        for pol, (m, lo, hi) in panels[ylabel].items():
            xs, m, lo, hi = _sorted(x, m, lo, hi)
            ax.plot(xs, m, marker="o", ms=3, color=colors[pol], label=pol)
            lo = np.where(np.isfinite(lo), lo, m)
            hi = np.where(np.isfinite(hi), hi, m)
            ax.fill_between(xs, lo, hi, color=colors[pol], alpha=0.18, linewidth=0)
        _setup_x(ax, np.asarray(x, dtype=np.float64), xlabel)
        xs = np.unique(np.asarray(x, dtype=np.float64))
        step = max(1, -(-xs.size // 7))   # at most about 7 labelled ticks
        ax.set_xticklabels([f"{v:.3g}" if i % step == 0 else "" for i, v in enumerate(xs)],
                           fontsize=7)
        if vline is not None:
            ax.axvline(vline, color="k", ls="--", lw=1)
        if hlines and ylabel in hlines:
            ax.axhline(hlines[ylabel], color="k", ls=":", lw=1)
        ax.set_ylabel(ylabel, fontsize=8)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if vline is not None and vline_label:
        handles.append(plt.Line2D([], [], color="k", ls="--", lw=1))
        labels.append(vline_label)
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(len(labels), 5),
               bbox_to_anchor=(0.5, -0.02))
    fig.suptitle("\n".join(textwrap.wrap(title, 110)), fontsize=9)
    fig.subplots_adjust(bottom=0.15)
    return _save(fig, path)


def plot_stacked_delays(x: Sequence[float], components: Mapping[str, Band], *, xlabel: str,
                        title: str, path: os.PathLike | str, total: Band | None = None,
                        knee: float | None = None) -> Path:
    """Stacked areas of the delay components (s) over the grid, with each component's 95% CI
    as error bars at the top of its layer and the total's CI as a grey band.

    Args:
      x: [G] grid values.
      components: name -> (mean [G], low [G], high [G]) per component, stacked in order.
      total: optional (mean, low, high) of the end-to-end latency.
    """
    fig, ax = plt.subplots(figsize=(6.6, 3.8))
    xs = np.sort(np.asarray(x, dtype=np.float64))
    base = np.zeros_like(xs)
    for i, (name, (m, lo, hi)) in enumerate(components.items()):
        _, m, lo, hi = _sorted(x, m, lo, hi)
        m = np.nan_to_num(m)
        color = DELAY_COLORS.get(name, _COLORS[i % len(_COLORS)])
        ax.fill_between(xs, base, base + m, color=color, alpha=0.75, label=name, linewidth=0)
        err_lo = np.nan_to_num(m - lo)
        err_hi = np.nan_to_num(hi - m)
        ax.errorbar(xs, base + m, yerr=[err_lo, err_hi], fmt="none", ecolor="k", elinewidth=0.8,
                    capsize=2)
        base = base + m
    if total is not None:
        _, tm, tlo, thi = _sorted(x, *total)
        ax.fill_between(xs, np.nan_to_num(tlo), np.nan_to_num(thi), color="0.4", alpha=0.25,
                        label="total (95% CI)", linewidth=0)
    _setup_x(ax, xs, xlabel)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.1)     # headroom for the knee label
    if knee is not None:
        _knee(ax, knee, "knee")
    ax.set_ylabel(DELAY_YLABEL)
    _title(ax, title)
    _legend_outside(ax)
    return _save(fig, path)


def plot_bars(names: Sequence[str], bands: Band, *, ylabel: str, title: str,
              path: os.PathLike | str) -> Path:
    """Bar chart of one metric per policy with 95% CI error bars."""
    m, lo, hi = (np.asarray(a, dtype=np.float64) for a in bands)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(names) + 1.5), 3.6))
    idx = np.arange(len(names))
    ax.bar(idx, np.nan_to_num(m), color=[_COLORS[i % len(_COLORS)] for i in idx], alpha=0.85)
    ax.errorbar(idx, np.nan_to_num(m), yerr=[np.nan_to_num(m - lo), np.nan_to_num(hi - m)],
                fmt="none", ecolor="k", capsize=3)
    ax.set_xticks(idx)
    ax.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    _title(ax, title)
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def plot_grouped_bars(groups: Sequence[str], series: Mapping[str, Band], *, ylabel: str,
                      title: str, path: os.PathLike | str) -> Path:
    """Bars grouped by ``groups`` (e.g. scenarios), one bar per series (e.g. row) in each group,
    with 95% CI error bars. ``series``: name -> (mean [G], low [G], high [G])."""
    n = max(len(series), 1)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(groups) + 2.5), 4.0))
    idx = np.arange(len(groups))
    for i, (name, (m, lo, hi)) in enumerate(series.items()):
        m, lo, hi = (np.asarray(a, dtype=np.float64) for a in (m, lo, hi))
        x = idx - 0.4 + (i + 0.5) * width
        ax.bar(x, np.nan_to_num(m), width, color=_COLORS[i % len(_COLORS)], alpha=0.85,
               label=name)
        ax.errorbar(x, np.nan_to_num(m), yerr=[np.nan_to_num(m - lo), np.nan_to_num(hi - m)],
                    fmt="none", ecolor="k", capsize=2, lw=0.8)
    ax.set_xticks(idx)
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    _title(ax, title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=6, loc="best")
    return _save(fig, path)


def plot_delay_split_bars(names: Sequence[str], components: Mapping[str, Sequence[float]], *,
                          title: str, path: os.PathLike | str) -> Path:
    """Stacked bars of the mean delay components (s) per policy."""
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(names) + 1.5), 3.6))
    idx = np.arange(len(names))
    base = np.zeros(len(names))
    for i, (comp, vals) in enumerate(components.items()):
        v = np.nan_to_num(np.asarray(vals, dtype=np.float64))
        ax.bar(idx, v, bottom=base, label=comp,
               color=DELAY_COLORS.get(comp, _COLORS[i % len(_COLORS)]), alpha=0.85)
        base = base + v
    ax.set_xticks(idx)
    ax.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel(DELAY_YLABEL)
    _title(ax, f"delay split — {title}")
    _legend_outside(ax)
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def plot_reliability(diagrams: Mapping[str, Mapping], path: os.PathLike | str,
                     title: str = "PRM reliability") -> Path:
    """Reliability diagrams: observed correct frequency against mean PRM score per bin.

    Args:
      diagrams: label (e.g. benchmark) -> ``calibration_report(...)["reliability"]`` dict
        (``mean_pred``, ``frac_pos``, ``count`` lists; None for empty bins), optionally with
        ``ece`` and ``auc`` entries for the legend.
    """
    fig, ax = plt.subplots(figsize=(4.6, 4.4))
    ax.plot([0, 1], [0, 1], color="0.5", ls="--", lw=1, label="perfect calibration")
    for i, (name, d) in enumerate(diagrams.items()):
        pred = np.array([np.nan if v is None else v for v in d["mean_pred"]], dtype=np.float64)
        frac = np.array([np.nan if v is None else v for v in d["frac_pos"]], dtype=np.float64)
        ok = np.isfinite(pred) & np.isfinite(frac)
        label = name
        if "ece" in d:
            label += f" (ECE {d['ece']:.3f}"
            label += f", AUC {d['auc']:.3f})" if "auc" in d else ")"
        ax.plot(pred[ok], frac[ok], marker="o", ms=4, color=_COLORS[i % len(_COLORS)],
                label=label)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("PRM score of the candidate step (bin mean)")
    ax.set_ylabel("observed final-correct frequency")
    _title(ax, title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return _save(fig, path)


def png_to_rgb(path: os.PathLike | str) -> np.ndarray:
    """Reads a PNG back as uint8 [H, W, 3] (for TensorBoard images)."""
    img = plt.imread(str(path))
    if img.dtype != np.uint8:
        img = (np.clip(img, 0.0, 1.0) * 255).round().astype(np.uint8)
    return img[..., :3]


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def is_valid_png(path: os.PathLike | str) -> bool:
    """The file starts with the PNG signature and decodes to a non-empty image."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        if f.read(8) != PNG_SIGNATURE:
            return False
    try:
        img = plt.imread(str(path))
    except (OSError, ValueError, SyntaxError):
        return False
    return img.ndim == 3 and img.shape[0] > 10 and img.shape[1] > 10
