"""Evaluation reports: aggregate replays over seeds, write `results.json`, `results.md` and plots."""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from streamfed.evaluation.replay import AlgorithmConfig, ReplayResult, Schedule
from streamfed.fleet.telemetry import ECE_BINS


def summarise(results: dict[str, list[ReplayResult]], cfg: AlgorithmConfig, schedule: Schedule,
              dataset: dict[str, Any]) -> dict[str, Any]:
    """Per algorithm: mean ± std over seeds of MSE (standardised, as the learners see it, and in the stream's
    units, `mse_stream_*`) and `R_c(T)/T`, uploads, wall time, config; for a classifier its accuracy, log loss,
    expected calibration error and regret in log loss (`classification`) instead of an MSE and the learner's
    regret."""
    out: dict[str, Any] = {
        "dataset": dataset,
        "config": cfg.as_dict(),
        "schedule": asdict(schedule),
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
        "algorithms": {},
    }
    for name, runs in results.items():
        mse = np.array([r.mse for r in runs])
        reg = np.array([r.avg_regret for r in runs])
        stream = np.array([r.mse_stream for r in runs])
        scores = [r.classification() for r in runs]
        extra: dict[str, Any] = {}
        if scores[0] is not None:
            extra["classification"] = {k: float(np.mean([sc[k] for sc in scores if sc is not None]))
                                       for k in ("accuracy", "log_loss", "ece", "log_loss_regret")}
            extra["classification_per_seed"] = scores
        out["algorithms"][name] = {
            "mse_mean": float(mse.mean()),
            "mse_std": float(mse.std(ddof=1)) if mse.size > 1 else 0.0,
            "avg_regret": float(reg.mean()),
            "avg_regret_std": float(reg.std(ddof=1)) if reg.size > 1 else 0.0,
            "uploaded_per_client_step": float(np.mean([r.uploaded_per_client_step for r in runs])),
            "wall_s": float(np.mean([r.wall_s for r in runs])),
            "rejected_steps": int(sum(int(r.rejected.sum()) for r in runs)),
            "seeds": len(runs),
            "mse_per_seed": mse.tolist(),
            "mse_per_client": np.mean([r.mse_per_client for r in runs], axis=0).tolist(),
            "clients": runs[0].clients,
            "mse_stream_mean": float(stream.mean()),
            "mse_stream_std": float(stream.std(ddof=1)) if stream.size > 1 else 0.0,
            "rmse_stream_mean": float(np.sqrt(stream).mean()),
            **extra,
        }
        if scores[0] is not None:  # a classifier: no MSE (its "prediction" is a class index), and no learner's
            # regret (each in its own loss: squared on the class index, Brier, log loss): `log_loss_regret` instead
            for key in ("mse_mean", "mse_std", "mse_stream_mean", "mse_stream_std", "rmse_stream_mean",
                        "avg_regret", "avg_regret_std"):
                out["algorithms"][name][key] = None
            out["algorithms"][name]["mse_per_seed"] = out["algorithms"][name]["mse_per_client"] = None
    return out


def _params_text(cfg: dict[str, Any]) -> str:
    shared = ", ".join(f"{k}={v}" for k, v in sorted(cfg.get("shared", {}).items()))
    own = "; ".join(f"{a}: " + ", ".join(f"{k}={v}" for k, v in sorted(p.items()))
                    for a, p in sorted(cfg.get("params", {}).items()))
    return " / ".join(t for t in (shared, own) if t) or "each algorithm's defaults"


def markdown_table(summary: dict[str, Any], command: str | None = None) -> str:
    """The summary as a markdown table (one row per algorithm)."""
    ds = summary["dataset"]
    cfg = summary["config"]
    lines = [
        f"Dataset: {ds.get('name')} ({ds.get('normalisation')} normalisation, {ds.get('split')} split, "
        f"{ds.get('clients')} clients, {ds.get('samples')} samples). Schedule: {summary['schedule']['kind']}.",
        f"Config: N={cfg['n_kernels']} kernels, D={cfg['n_features']}, M={cfg['bin_size']}; parameters "
        f"{_params_text(cfg)}.",
        "",
        "| algorithm | MSE (mean ± std over seeds) | RMSE in the stream's units | avg R_c(T)/T | "
        "numbers uploaded / client step | wall s | rejected steps |",
        "|---|---|---|---|---|---|---|",
    ]
    classifiers = {n: a for n, a in summary["algorithms"].items() if a.get("classification")}
    for name, a in summary["algorithms"].items():
        if name in classifiers:
            continue
        lines.append(
            f"| {name} | {a['mse_mean']:.6f} ± {a['mse_std']:.6f} | {a['rmse_stream_mean']:.6g} | "
            f"{a['avg_regret']:.3e} | {a['uploaded_per_client_step']:.0f} | {a['wall_s']:.1f} | "
            f"{a['rejected_steps']} |"
        )
    if classifiers:
        if len(classifiers) == len(summary["algorithms"]):
            lines = lines[:-3]
        lines += ["", "| classifier | accuracy | log loss | ECE | avg R_c(T)/T in log loss (vs class frequencies) | "
                  "numbers uploaded / client step | wall s | rejected steps |", "|---|---|---|---|---|---|---|---|"]
        for name, a in classifiers.items():
            c = a["classification"]
            lines.append(f"| {name} | {c['accuracy']:.4f} | {c['log_loss']:.4f} | {c['ece']:.4f} | "
                         f"{c.get('log_loss_regret', float('nan')):.3e} | "
                         f"{a['uploaded_per_client_step']:.0f} | {a['wall_s']:.1f} | {a['rejected_steps']} |")
    if command:
        lines = [f"Command: `{command}`", "", *lines]
    return "\n".join(lines) + "\n"


def plot_results(results: dict[str, list[ReplayResult]], out_dir: Path) -> list[Path]:
    """`regret.png` (R(t)/t), `mse.png` (MSE up to t) and `weights.png` (client 0's kernel weights)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # not pyplot: no GUI backend, no figure manager to import
    from matplotlib.ticker import LogFormatter

    paths = []
    for fname, curve, ylabel in (
        ("regret.png", lambda r: r.regret_rate_curve(), "average regret  mean_c R_c(t)/t"),
        ("mse.png", lambda r: r.mse_curve(), "MSE of all predictions up to t"),
    ):
        fig = Figure(figsize=(7, 4.2))
        ax = fig.subplots()
        for name, runs in results.items():
            r0 = runs[0]
            curves = np.array([curve(r) for r in runs])
            x = r0.checkpoints + 1
            m = curves.mean(axis=0)
            ax.plot(x, m, label=name)
            if len(runs) > 1:
                ax.fill_between(x, curves.min(axis=0), curves.max(axis=0), alpha=0.15)
        ax.set_xlabel("t (samples per client)")
        ax.set_ylabel(ylabel)
        if fname == "mse.png":
            ax.set_yscale("log")
            # plain tick labels (0.001, 2e-3): the default's 10^x needs mathtext, whose parser is most of the plot's
            # cost in a short replay
            ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
            ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        # fixed margins: the labels are these strings and short tick labels (a tight layout would measure them)
        fig.subplots_adjust(left=0.12, right=0.97, bottom=0.12, top=0.96)
        path = out_dir / fname
        fig.savefig(path, dpi=110)
        paths.append(path)
    # the kernel weights of the first algorithm that has personal ones (several kernels that move)
    weighted = [runs[0] for runs in results.values()
                if runs and len(runs[0].kernel_names) > 1 and np.ptp(runs[0].weights, axis=0).any()]
    if weighted:
        r = weighted[0]
        fig = Figure(figsize=(7, 4.2))
        ax = fig.subplots()
        ax.stackplot(r.checkpoints + 1, r.weights.T, labels=r.kernel_names)
        ax.set_xlabel("t")
        ax.set_ylabel(f"{r.algorithm}: kernel weights of client {r.clients[0]}")
        ax.set_ylim(0, 1)
        legend = ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        # the legend right of the axes: as wide as the kernels' names need (measured, not a whole tight layout)
        width = legend.get_window_extent(FigureCanvasAgg(fig).get_renderer()).width / fig.bbox.width
        fig.subplots_adjust(left=0.1, right=max(0.5, 0.97 - width), bottom=0.12, top=0.96)
        path = out_dir / "weights.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    classifiers = {name: runs for name, runs in results.items() if runs and runs[0].probas}
    if classifiers:
        paths.append(_reliability(classifiers, out_dir))
    return paths


def reliability_bins(runs: Sequence[ReplayResult], bins: int = ECE_BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per equal-width bin of the top probability (the agents' 15 by default, as their ECE), over every scored
    step of `runs`: the count, the mean confidence and the accuracy (NaN in an empty bin) — the points of a
    reliability diagram.

    >>> r = ReplayResult("x", ["a"], np.array([2]), [np.zeros(2)], np.array([1]), np.zeros((1, 1)),
    ...                  np.zeros((1, 0)), [], np.zeros(1), 0.0, ys=[np.array([1.0, 0.0])],
    ...                  probas=[np.array([[0.2, 0.8], [0.15, 0.85]])])
    >>> n, conf, acc = reliability_bins([r], bins=10); int(n[8]), round(float(conf[8]), 3), float(acc[8])
    (2, 0.825, 0.5)
    """
    top, hit = [], []
    for r in runs:
        for p, y in zip(r.probas, r.ys, strict=True):
            ok = ~np.isnan(p[:, 0])
            top.append(p[ok].max(axis=1))
            hit.append(p[ok].argmax(axis=1) == y[ok].astype(int))
    conf, correct = np.concatenate(top), np.concatenate(hit)
    which = np.minimum((conf * bins).astype(int), bins - 1)
    n = np.bincount(which, minlength=bins)
    with np.errstate(invalid="ignore"):
        return n, np.bincount(which, conf, bins) / n, np.bincount(which, correct, bins) / n


def _reliability(classifiers: dict[str, list[ReplayResult]], out_dir: Path) -> Path:
    """`reliability.png`: each classifier's accuracy against its confidence, per bin (pooled over seeds)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 5))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--", label="calibrated")
    for name, runs in classifiers.items():
        n, conf, acc = reliability_bins(runs)
        ok = n > 0
        ax.plot(conf[ok], acc[ok], marker="o", label=name)
    ax.set_xlabel("confidence (top class probability)")
    ax.set_ylabel("accuracy")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "reliability.png"
    fig.savefig(path, dpi=110)
    return path


def write_report(results: dict[str, list[ReplayResult]], summary: dict[str, Any], out_dir: Path,
                 command: str | None = None, plots: bool = True) -> Sequence[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "results.md").write_text(markdown_table(summary, command))
    written = [out_dir / "results.json", out_dir / "results.md"]
    if plots:
        written += plot_results(results, out_dir)
    return written
