"""Figures from every cell's metrics and logs (PNG + PDF, matplotlib Agg) under results/figures.

- accuracy_vs_K: linear (solid) and kNN (dashed) top-1 over the number of negatives, one line
  per mechanism (end-to-end, memory bank, MoCo), log x (the paper's Figure 3)
- accuracy_vs_m: top-1 over the key-encoder momentum; failed runs marked "fail"

Points are means over seeds, error bars their 95 % confidence intervals (pipeline.report.stats).
- staleness: queue age (mean solid, max dashed, in steps) over the epochs, one line per cell
- bn_leak: instance accuracy and the kNN monitor over the epochs, the BN-leak guard on and off
- curves/<cell>: pretraining loss, instance accuracy (and the kNN monitor if logged),
  linear-probe curve and final kNN top-1

A figure without data yet still exists (it says so), so the set of files is fixed.
Called by pipeline.tables; ``write_figures(collect(results), results)`` alone works too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from pipeline.base.layout import FIGURE_FORMATS, FIGURES, cell_file
from pipeline.dag.grid import format_value
from pipeline.methods import reported_metrics
from pipeline.report.studies import MECHANISMS, groups, mechanism_groups, method_groups, shuffle_bn_groups, value
from pipeline.runtime.io import atomic_path


def pyplot():
    """matplotlib (Agg), imported on first use: the Snakefile imports this module's names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    """path without suffix -> path.png and path.pdf (atomic; PDFs without a creation date)."""
    for ext in FIGURE_FORMATS:
        with atomic_path(path.with_name(f"{path.name}.{ext}")) as tmp:
            fig.savefig(
                tmp,
                format=ext,
                dpi=150,
                bbox_inches="tight",
                metadata={"CreationDate": None} if ext == "pdf" else {"Software": None},
            )
    pyplot().close(fig)


def _no_data(ax, text="no data yet") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def _plot_values(ax, xs, vals, **kw):
    """Points with a mean (error bars: the 95 % CI over seeds); failed ones as red crosses on the x axis."""
    ok = [(x, v) for x, v in zip(xs, vals) if v.status == "ok"]
    if ok:
        ax.errorbar(
            [x for x, _ in ok], [v.mean for _, v in ok], yerr=[v.half or 0 for _, v in ok], marker="o", capsize=3, **kw
        )
    return [x for x, v in zip(xs, vals) if v.status == "fail"]


def _mark_fails(ax, xs) -> None:
    if xs:
        ax.plot(
            xs,
            [0.02] * len(xs),
            "x",
            color="tab:red",
            ms=9,
            mew=2,
            transform=ax.get_xaxis_transform(),
            label="fail (diverged or collapsed)",
        )


def accuracy_vs_k(gs):
    fig, ax = pyplot().subplots(figsize=(5, 3.5))
    sel = mechanism_groups(gs)
    fails = []
    for i, (mech, label) in enumerate(MECHANISMS.items()):
        sizes = sorted(k for m, k in sel if m == mech)
        if not sizes:
            continue
        color = f"C{i}"
        cells = [sel[(mech, k)].cells for k in sizes]
        fails += _plot_values(ax, sizes, [value(c, "top1") for c in cells], color=color, label=f"{label} (linear)")
        _plot_values(
            ax, sizes, [value(c, "knn_top1") for c in cells], color=color, ls="--", mfc="white", label=f"{label} (kNN)"
        )
    _mark_fails(ax, fails)
    if sel:
        from matplotlib.ticker import ScalarFormatter

        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.legend(fontsize=7)
    else:
        _no_data(ax)
    ax.set(
        xlabel="K (negatives; batch size for end-to-end)",
        ylabel="top-1 accuracy (%)",
        title="Accuracy vs K per mechanism",
    )
    ax.grid(alpha=0.3)
    return fig


def accuracy_vs_m(gs):
    fig, ax = pyplot().subplots(figsize=(5, 3.5))
    sel = {g.stated("m"): g for g in gs.values() if g.is_moco and set(g.diff) <= {"m"}}
    ms = sorted(m for m in sel if m is not None)
    xs = list(range(len(ms)))  # the paper's m (0 ... 0.9999) are evenly spaced on this axis
    fails = _plot_values(ax, xs, [value(sel[m].cells, "top1") for m in ms], color="C0", label="linear")
    _plot_values(ax, xs, [value(sel[m].cells, "knn_top1") for m in ms], color="C1", ls="--", label="kNN")
    _mark_fails(ax, fails)
    if ms:
        ax.set_xticks(xs, [format_value(m) for m in ms])
        ax.legend(fontsize=7)
    else:
        _no_data(ax)
    ax.set(xlabel="momentum m", ylabel="top-1 accuracy (%)", title="Accuracy vs momentum")
    ax.grid(alpha=0.3)
    return fig


def methods(gs):
    """The main table's rows as a figure: each method's linear top-1 by seed (one grey line per
    seed across the methods: the pairing of the paired Δs), its mean and 95 % CI beside."""
    fig, ax = pyplot().subplots(figsize=(max(5, 1.1 * len(gs) + 2), 3.5))
    # the table's method and variant, and its other settings on a second line: a folder holding the
    # claims' cells beside the grid's has several rows of one method, told apart only by those
    picked = [(keys, g) for keys, g in method_groups(gs) if g is not None]
    backbones = len({keys[2] for keys, _ in picked}) > 1  # then each tick names its backbone
    rows = [(_method_label(keys, backbones), g) for keys, g in picked]
    vals = [value(g.cells, "top1") for _, g in rows]
    xs = list(range(len(rows)))
    for seed in sorted({s for v in vals for s in v.by_seed}):
        pts = [(x, v.by_seed[seed]) for x, v in zip(xs, vals) if seed in v.by_seed]
        ax.plot([x for x, _ in pts], [y for _, y in pts], color="0.75", lw=0.8, marker=".", zorder=1)
    _mark_fails(ax, _plot_values(ax, xs, vals, color="C0", ls="none", label="mean ± 95 % CI", zorder=2))
    if rows:
        ax.set_xticks(xs, [label for label, _ in rows], rotation=20, ha="right", fontsize=8)
        ax.legend(fontsize=7)
    else:
        _no_data(ax)
    ax.set(ylabel="linear top-1 (%)", title="Methods, paired by seed (grey: one seed)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _method_label(keys: list[str], backbone: bool = False) -> str:
    """A methods row's tick: "MoCo (base cell) v2"; below it its backbone (``backbone``: where
    the rows differ in it), and its other settings ("epochs=9, batch_size=256")."""
    label = " ".join(k for k in keys[:2] if k)
    below = [k for k in ([keys[2]] if backbone else []) + keys[3:4] if k]
    return "\n".join([label, *below])


def read_log(results: Path, cell: str) -> pd.DataFrame:
    try:
        return pd.read_csv(cell_file(results, cell, "log"))
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame()


def staleness(results: Path, cells: list[str]):
    fig, ax = pyplot().subplots(figsize=(6, 3.5))
    n = 0
    for cell in cells:
        log = read_log(results, cell)
        if log.empty or "queue_age_mean" not in log or log["queue_age_mean"].isna().all():
            continue
        (line,) = ax.plot(log["epoch"], log["queue_age_mean"], label=cell)
        ax.plot(log["epoch"], log["queue_age_max"], ls="--", color=line.get_color())
        n += 1
    if n:
        ax.legend(
            fontsize=6,
            ncol=max(1, n // 12),
            title="mean (solid), max (dashed)",
            title_fontsize=6,
            loc="center left",
            bbox_to_anchor=(1.01, 0.5),
        )
    else:
        _no_data(ax, "no cell with a queue yet")
    _epoch_axes(ax, "age of queued keys (steps)", "Queue staleness")
    return fig


def _epoch_axes(ax, ylabel: str, title: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set(xlabel="epoch", ylabel=ylabel, title=title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def bn_leak(results: Path, gs):
    """The leak's signature over training: instance accuracy up, kNN down without the guard."""
    fig, ax = pyplot().subplots(figsize=(5, 3.5))
    sel = shuffle_bn_groups(gs)
    drawn = 0
    for on, color in ((True, "C0"), (False, "C3")):
        if on not in sel:
            continue
        log = read_log(results, sel[on].cells["cell"].iloc[0])  # the first seed of the group
        if log.empty:
            continue
        label = "guard on" if on else "guard off"
        ax.plot(log["epoch"], log["inst_acc"], color=color, label=f"{label}: instance (pretext)")
        if "knn" in log and log["knn"].notna().any():
            knn = log[["epoch", "knn"]].dropna()
            ax.plot(knn["epoch"], knn["knn"], color=color, ls="--", marker="o", label=f"{label}: kNN (val)")
        drawn += 1
    if drawn:
        ax.legend(fontsize=7)
    else:
        _no_data(ax, "no shuffle_bn on/off cells yet")
    _epoch_axes(ax, "accuracy (%)", "The BN leak: guard on vs off")
    return fig


def curves(results: Path, cell: str, status: str):
    from matplotlib.ticker import MaxNLocator

    fig, axes = pyplot().subplots(1, 3, figsize=(11, 3))
    log = read_log(results, cell)
    probe = {}
    try:
        probe = json.loads(Path(cell_file(results, cell, "probe")).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        pass
    if log.empty:
        for ax in axes[:2]:
            _no_data(ax, "no pretraining epochs" if status != "missing" else "not computed yet")
    else:
        axes[0].plot(log["epoch"], log["loss"], marker=".")
        for metric in reported_metrics().values():  # the pretext metrics its method reports
            if metric.label and metric.name in log:
                axes[1].plot(log["epoch"], metric.scale * log[metric.name], marker=".", label=metric.label)
        if "knn" in log and log["knn"].notna().any():  # the kNN monitor (every knn_every epochs)
            knn = log[["epoch", "knn"]].dropna()
            axes[1].plot(knn["epoch"], knn["knn"], marker="o", label="kNN monitor (val)")
        if axes[1].lines:
            axes[1].legend(fontsize=7)
    axes[0].set(xlabel="epoch", ylabel="loss", title="pretraining loss")
    axes[1].set(xlabel="epoch", ylabel="%", title="pretext metrics")
    curve = pd.DataFrame(probe.get("curve") or [])
    if not curve.empty:
        axes[2].plot(curve["epoch"], curve["val_top1"], label="linear probe (val)")
    if probe.get("knn_top1") is not None:
        axes[2].axhline(probe["knn_top1"], color="C1", ls="--", label=f"kNN top-1 {probe['knn_top1']:.1f}")
    if curve.empty and probe.get("knn_top1") is None:
        _no_data(axes[2], "no probe yet")
    else:
        axes[2].legend(fontsize=7)
    axes[2].set(xlabel="probe epoch", ylabel="top-1 (%)", title="linear probe / kNN")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"{cell}" + (" (failed: diverged or collapsed)" if status == "fail" else ""))
    fig.tight_layout()
    return fig


def write_figures(df: pd.DataFrame, results: Path, names=FIGURES) -> list[Path]:
    """The figures ``names`` (pipeline.dag.sweeps.drawn: those of the studies swept) and every
    cell's curves; returns the paths written (without suffix)."""
    out = results / "figures"
    (out / "curves").mkdir(parents=True, exist_ok=True)
    gs = groups(df) if not df.empty else {}
    cells = list(df["cell"]) if not df.empty else []
    figs = {
        "accuracy_vs_K": lambda: accuracy_vs_k(gs),
        "accuracy_vs_m": lambda: accuracy_vs_m(gs),
        "staleness": lambda: staleness(results, cells),
        "bn_leak": lambda: bn_leak(results, gs),
        "methods": lambda: methods(gs),
    }
    assert list(figs) == FIGURES
    written = []
    for name in names:
        save(figs[name](), out / name)
        written.append(out / name)
    for cell, status in zip(cells, df["status"] if cells else []):
        save(curves(results, cell, status), out / "curves" / cell)
        written.append(out / "curves" / cell)
    return written
