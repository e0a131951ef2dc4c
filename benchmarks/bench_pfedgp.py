"""pFedGP experiments: personal GP classifiers on a shared deep kernel, against FedAvg and local-only models.

    .venv/bin/python benchmarks/bench_pfedgp.py [--quick] [--out PATH.md] [--parts abc]

* (a) The paper's label-skew protocol (§6.1, appendix D) on scikit-learn's `digits` (1797 8×8 images, 10
  classes): `N ∈ {10, 50}` clients, 2 classes each; for each client holding class `c`, a fraction
  `α ~ U(0.4, 0.6)` normalised over the holders of `c` of that class's images. Each client keeps 20 % of its
  images as its test set and streams the rest (`--passes` times, reshuffled after the first pass) through the
  plug-in contract (`build_arrangement`: the same learners and aggregation an agent and an aggregator run; the
  aggregation takes each step's uploads as one round and every client gets the new global). Test accuracy,
  log loss and expected calibration error (15 bins on the top probability) over all clients' test images,
  and the prequential accuracy of the first pass; 3 seeds; reliability diagrams (pooled over seeds) to
  `docs/img/pfedgp_reliability_digits_<N>.png` (a `--quick` run with `--out`: beside its markdown). Rows:
  pFedGP (full GP; the predictive likelihood, and the marginal one), pFedGP-IP (FITC, `M` shared inducing
  inputs), FedAvg (the same network with a softmax head, everything averaged), pFedGP with a private network
  per client (the paper's "Local"), local-only GP classifiers on the fixed random network (no learning), and a
  local River classifier (Gaussian naive Bayes).
  Inputs: pixels / 16, standardised with the training pixels' mean and spread.
* (b) The Beijing stations as clients predicting the PM2.5 air-quality band (six Chinese AQI bands) from the
  other readings (`streamfed.evaluation.datasets.aqi`), the first `--beijing-steps` hours of each station,
  inputs standardised online (past only, winsorised at ±5σ); prequential accuracy, log loss and ECE; 3 seeds.
* (c) Cost on this machine (one core): per-sample predict and learn time of one client against its budget
  (full GP and FITC), the local update (phase-1 step) time, bytes per upload and per round (encoded
  messages), and the process's peak RSS.

`OPENBLAS_NUM_THREADS=1`, `torch.set_num_threads(1)`. With `--out PATH.md` the numbers also go to `PATH.json`.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from streamfed.core.standardise import INPUT_CLIP, OnlineStandardiser  # noqa: E402
from streamfed.evaluation.datasets.aqi import beijing_aqi  # noqa: E402
from streamfed.evaluation.replay import AlgorithmConfig, build_arrangement  # noqa: E402
from streamfed.wire.message import encode

torch.set_num_threads(1)
RESULTS: dict[str, Any] = {}
ECE_BINS = 15
IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
FIG_DIR = [IMG]  # where the plots go: docs/img, except for a --quick run with --out (beside it)


# =========================================================================== metrics


def metrics(P: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Accuracy, log loss (probabilities floored at 1e-12) and ECE (15 equal-width bins of the top probability)."""
    y = np.asarray(y, dtype=np.int64)
    conf, pred = P.max(axis=1), P.argmax(axis=1)
    hit = (pred == y).astype(float)
    ll = -np.log(np.maximum(P[np.arange(y.size), y], 1e-12))
    bins = np.minimum((conf * ECE_BINS).astype(int), ECE_BINS - 1)
    ece = sum(abs(hit[bins == b].mean() - conf[bins == b].mean()) * np.mean(bins == b)
              for b in range(ECE_BINS) if np.any(bins == b))
    counts = np.bincount(bins, minlength=ECE_BINS)
    return {"accuracy": float(hit.mean()), "log_loss": float(ll.mean()), "ece": float(ece),
            "bin_count": counts.tolist(), "bin_correct": np.bincount(bins, hit, ECE_BINS).tolist(),
            "bin_confidence": np.bincount(bins, conf, ECE_BINS).tolist()}


def reliability_plot(curves: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    """Reliability diagrams (accuracy against confidence per bin, pooled over seeds) side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(3.0 * len(curves), 3.2), sharey=True)
    for ax, (name, m) in zip(np.atleast_1d(axes), curves.items(), strict=True):
        n, k, c = (np.array(m[key], dtype=float) for key in ("bin_count", "bin_correct", "bin_confidence"))
        ok = n > 0
        edges = np.linspace(0, 1, ECE_BINS + 1)
        ax.bar(edges[:-1][ok], k[ok] / n[ok], width=1 / ECE_BINS, align="edge", edgecolor="k", alpha=0.7)
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.plot(c[ok] / n[ok], k[ok] / n[ok], "r.", ms=4)
        ece = float(np.sum(np.abs(k[ok] - c[ok])) / n.sum())
        ax.set_title(f"{name}\nECE {ece:.3f}", fontsize=8)
        ax.set_xlabel("confidence")
    np.atleast_1d(axes)[0].set_ylabel("accuracy")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def short(m: dict[str, Any]) -> str:
    return ", ".join(f"{k} {m[k]:.3f}" for k in ("accuracy", "log_loss", "ece"))


def mean_std(rows: list[dict[str, float]], key: str) -> tuple[float, float]:
    v = np.array([r[key] for r in rows])
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


# =========================================================================== data


def digits_label_skew(n_clients: int, seed: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per client `(X_train, y_train, X_test, y_test)` under the paper's label-skew assignment."""
    from sklearn.datasets import load_digits

    d = load_digits()
    X, y = d.data / 16.0, d.target.astype(np.int64)
    rng = np.random.default_rng([seed, 20])
    # two distinct classes per client, every class held by someone (cycled, then shuffled)
    classes = [((2 * i) % 10, (2 * i + 1) % 10) for i in range(n_clients)]
    classes = [classes[i] for i in rng.permutation(n_clients)]
    alpha = {(i, c): rng.uniform(0.4, 0.6) for i, cs in enumerate(classes) for c in cs}
    parts: list[list[int]] = [[] for _ in range(n_clients)]
    for c in range(10):
        holders = [i for i, cs in enumerate(classes) if c in cs]
        idx = rng.permutation(np.flatnonzero(y == c))
        w = np.array([alpha[(i, c)] for i in holders])
        cuts = np.round(np.cumsum(w / w.sum()) * idx.size).astype(int)
        for i, a, b in zip(holders, np.concatenate([[0], cuts[:-1]]), cuts, strict=True):
            parts[i] += idx[a:b].tolist()
    out, train_rows = [], []
    for p in parts:
        p = rng.permutation(p)
        k = max(1, int(round(0.2 * len(p))))
        out.append((p[k:], p[:k]))
        train_rows += p[k:].tolist()
    mu, sd = X[train_rows].mean(0), X[train_rows].std(0)
    sd[sd == 0] = 1.0
    Z = (X - mu) / sd
    return [(Z[tr], y[tr], Z[te], y[te]) for tr, te in out]


# =========================================================================== the harness


def run_federated(variant: str, params: dict[str, Any], clients: list[tuple[np.ndarray, np.ndarray]], seed: int,
                  passes: int = 1, tests: list[tuple[np.ndarray, np.ndarray]] | None = None,
                  scale_online: bool = False) -> dict[str, Any]:
    """Stream every client's samples through the plug-in contract (`build_arrangement`): each step the live
    clients predict (class probabilities), learn and upload; the aggregation takes the step's uploads as one
    round and every client of it receives the new global. Returns prequential and test metrics, bytes."""
    n, d = len(clients), clients[0][0].shape[1]
    arr = build_arrangement(variant, n, d, AlgorithmConfig(params={"pfedgp": params}), seed)
    learners, aggs, of = arr.learners, arr.aggregations, arr.aggregation_of
    scales = [OnlineStandardiser(d, clip=INPUT_CLIP) for _ in range(n)] if scale_online else None
    rng = np.random.default_rng([seed, 7])
    probs: list[list[np.ndarray]] = [[] for _ in range(n)]
    labels: list[list[int]] = [[] for _ in range(n)]
    seqs = np.zeros(n, dtype=np.int64)
    up_bytes: list[int] = []
    round_bytes: list[int] = []
    learn_s, steps = 0.0, 0
    t0 = time.perf_counter()
    for p in range(passes):
        orders = [np.arange(len(y)) if p == 0 else rng.permutation(len(y)) for _, y in clients]
        for t in range(max(len(y) for _, y in clients)):
            items: dict[int, list[tuple[str, Any]]] = {}
            nbytes = 0
            for c in range(n):
                X, y = clients[c]
                if t >= len(y):
                    continue
                x, label = X[orders[c][t]], int(y[orders[c][t]])
                if scales is not None:
                    z = scales[c].transform(x) if scales[c].ready else None
                    scales[c].update(x)
                    if z is None:
                        continue
                    x = z
                s = time.perf_counter()
                pr = learners[c].class_probabilities(x)
                learners[c].learn(x, float(label))
                learn_s += time.perf_counter() - s
                steps += 1
                if p == 0:
                    probs[c].append(pr)
                    labels[c].append(label)
                up = learners[c].take_update()
                if up is None:
                    continue
                seqs[c] = up.seq if up.seq is not None else seqs[c] + 1
                msg = arr.message(c, int(seqs[c]), up)
                b = len(encode(msg))
                up_bytes.append(b)
                nbytes += b
                items.setdefault(of[c], []).append((arr.names[c], aggs[of[c]].check(msg)))
            for a, its in items.items():
                before = aggs[a].version
                aggs[a].apply_round(t + 1, its)
                if aggs[a].version != before:
                    arr.broadcast(aggs[a], [c for c in range(n) if of[c] == a])
                    nbytes += len(encode(arr.global_message(aggs[a]))) * sum(1 for c in range(n) if of[c] == a)
            if nbytes:
                round_bytes.append(nbytes)
    out: dict[str, Any] = {"wall_s": time.perf_counter() - t0, "us_per_step": 1e6 * learn_s / max(steps, 1),
                           "bytes_per_upload": float(np.mean(up_bytes)) if up_bytes else 0.0,
                           "bytes_per_round": float(np.mean(round_bytes)) if round_bytes else 0.0,
                           "epochs": float(np.mean([getattr(lr.client, "epoch", 0) for lr in learners]))}
    P = np.concatenate([np.stack(pc) for pc in probs if pc])
    out["prequential"] = metrics(P, np.concatenate([np.array(lc) for lc in labels if lc]))
    if tests is not None:
        P = np.concatenate([lr.client.predict_many(Xt) for lr, (Xt, _) in zip(learners, tests, strict=True)])
        out["test"] = metrics(P, np.concatenate([yt for _, yt in tests]))
    return out


def run_river(make: Callable[[], Any], n_classes: int, clients: list[tuple[np.ndarray, np.ndarray]], passes: int = 1,
              tests: list[tuple[np.ndarray, np.ndarray]] | None = None, seed: int = 0,
              scale_online: bool = False) -> dict[str, Any]:
    """A River classifier per client (local only), the same streams."""
    rng = np.random.default_rng([seed, 7])
    probs, labels, models = [], [], []
    t0 = time.perf_counter()

    def vec(P: dict) -> np.ndarray:
        v = np.array([float(P.get(k, 0.0)) for k in range(n_classes)])
        return v / v.sum() if v.sum() > 0 else np.full(n_classes, 1.0 / n_classes)

    for X, y in clients:
        m = make()
        sc = OnlineStandardiser(X.shape[1], clip=INPUT_CLIP) if scale_online else None
        for p in range(passes):
            order = np.arange(len(y)) if p == 0 else rng.permutation(len(y))
            for i in order:
                x = X[i]
                if sc is not None:
                    z = sc.transform(x) if sc.ready else None
                    sc.update(x)
                    if z is None:
                        continue
                    x = z
                xd = {f"x{j}": float(v) for j, v in enumerate(x)}
                if p == 0:
                    probs.append(vec(m.predict_proba_one(xd)))
                    labels.append(int(y[i]))
                m.learn_one(xd, int(y[i]))
        models.append(m)
    out: dict[str, Any] = {"wall_s": time.perf_counter() - t0, "bytes_per_round": 0.0, "bytes_per_upload": 0.0,
                           "prequential": metrics(np.stack(probs), np.array(labels))}
    if tests is not None:
        P = np.stack([vec(m.predict_proba_one({f"x{j}": float(v) for j, v in enumerate(x)}))
                      for m, (Xt, _) in zip(models, tests, strict=True) for x in Xt])
        out["test"] = metrics(P, np.concatenate([yt for _, yt in tests]))
    return out


def river_nb() -> Any:
    from river import naive_bayes

    return naive_bayes.GaussianNB()


# =========================================================================== (a) digits, label skew

NET = {"widths": [32, 8], "n_omega": 32}


def methods_a(quick: bool) -> dict[str, tuple[str, dict[str, Any]] | None]:
    common = {"n_classes": 10, **NET, "budget": 24 if quick else 40, "fit_every": 32, "fit_steps": 3,
              "learning_rate": 0.01, "min_proposal_weight": 32.0, "proposal_quorum": 0.2, "max_chunk_bytes": 8192}
    return {
        "pFedGP": ("pfedgp", common),
        "pFedGP, marginal likelihood": ("pfedgp", {**common, "objective": "marginal"}),
        "pFedGP-IP (M=16)": ("pfedgp", {**common, "inducing": 16}),
        "FedAvg (softmax head)": ("pfedgp", {**common, "head": "softmax", "fit_steps": 10, "learning_rate": 0.02}),
        "pFedGP local (own network per client)": ("pfedgp-local", common),
        "local GP, fixed random network": ("pfedgp", {**common, "learn_kernel": False}),
        "local River GaussianNB": None,
    }


def part_a(quick: bool, passes: int) -> list[str]:
    sizes = [10] if quick else [10, 50]
    seeds = [0] if quick else [0, 1, 2]
    cap = 60 if quick else None  # quick: each client's first 60 training images only
    lines = ["## (a) digits, label skew (2 classes per client)", "",
             f"{passes} pass(es) over each client's training images"
             f"{f' (its first {cap} only)' if cap else ''}; test metrics on its held-out 20 %; "
             f"mean ± std over seeds {seeds}.", ""]
    table: dict[str, Any] = {}
    curves: dict[int, dict[str, Any]] = {}
    for n in sizes:
        lines += [f"### {n} clients", "",
                  "| method | test accuracy | test log loss | test ECE | prequential acc. (pass 1) | MB/round | s |",
                  "|---|---|---|---|---|---|---|"]
        for name, spec in methods_a(quick).items():
            rows = []
            for seed in seeds:
                data = digits_label_skew(n, seed)
                train = [(a[:cap], b[:cap]) for a, b, _, _ in data]
                tests = [(c, d) for _, _, c, d in data]
                if spec is None:
                    r = run_river(river_nb, 10, train, passes, tests, seed)
                else:
                    r = run_federated(spec[0], spec[1], train, seed, passes, tests)
                rows.append(r)
                print(f"  digits N={n} {name} seed {seed}: {short(r['test'])} ({r['wall_s']:.0f} s)", flush=True)
            flat = [{"acc": r["test"]["accuracy"], "ll": r["test"]["log_loss"], "ece": r["test"]["ece"],
                     "pre": r["prequential"]["accuracy"], "mb": r["bytes_per_round"] / 1e6, "s": r["wall_s"]}
                    for r in rows]
            cells = [f"{mean_std(flat, k)[0]:.3f} ± {mean_std(flat, k)[1]:.3f}" for k in ("acc", "ll", "ece", "pre")]
            lines.append(f"| {name} | {' | '.join(cells)} | {mean_std(flat, 'mb')[0]:.3f} | "
                         f"{mean_std(flat, 's')[0]:.0f} |")
            table[f"N{n}/{name}"] = rows
            curves.setdefault(n, {})[name] = {key: np.sum([r["test"][key] for r in rows], axis=0).tolist()
                                              for key in ("bin_count", "bin_correct", "bin_confidence")}
        lines.append("")
    RESULTS["digits"] = table
    for n, cv in curves.items():
        path = FIG_DIR[0] / f"pfedgp_reliability_digits_{n}.png"
        reliability_plot(cv, path, f"digits, {n} clients, 2 classes each: test reliability (pooled over seeds)")
        lines += [f"![reliability, {n} clients](../../docs/img/{path.name})", ""]
    return lines


# =========================================================================== (b) Beijing AQI bands


def part_b(quick: bool, steps: int) -> list[str]:
    steps = 100 if quick else steps
    seeds = [0] if quick else [0, 1, 2]
    fleet = beijing_aqi(steps=steps)
    clients = [(s.X, s.y.astype(np.int64)) for s in fleet.streams]
    counts = np.bincount(np.concatenate([y for _, y in clients]), minlength=6)
    common = {"n_classes": 6, "widths": [16, 8], "n_omega": 16, "budget": 24, "refresh_every": 8, "fit_every": 96,
              "fit_steps": 3, "min_proposal_weight": 64.0, "proposal_quorum": 0.3, "max_chunk_bytes": 8192}
    methods: dict[str, tuple[str, dict[str, Any]] | None] = {
        "pFedGP": ("pfedgp", common),
        "pFedGP-IP (M=16)": ("pfedgp", {**common, "inducing": 16}),
        "FedAvg (softmax head)": ("pfedgp", {**common, "head": "softmax", "fit_steps": 10, "learning_rate": 0.02}),
        "local GP, fixed random network": ("pfedgp", {**common, "learn_kernel": False}),
        "local River GaussianNB": None,
    }
    lines = ["## (b) Beijing: the PM2.5 air-quality band (6 classes) from the other readings", "",
             f"12 stations, first {steps} hours each (class counts I–VI: {counts.tolist()}); prequential metrics "
             f"(inputs standardised online); mean ± std over seeds {seeds}.", "",
             "| method | accuracy | log loss | ECE | µs/sample | MB/round | s |", "|---|---|---|---|---|---|---|"]
    table: dict[str, Any] = {"class_counts": counts.tolist()}
    for name, spec in methods.items():
        rows = []
        for seed in seeds:
            if spec is None:
                r = run_river(river_nb, 6, clients, 1, None, seed, scale_online=True)
                r["us_per_step"] = 1e6 * r["wall_s"] / sum(len(y) for _, y in clients)
            else:
                r = run_federated(spec[0], spec[1], clients, seed, 1, None, scale_online=True)
            rows.append(r)
            print(f"  beijing {name} seed {seed}: {short(r['prequential'])} ({r['wall_s']:.0f} s)", flush=True)
        flat = [{"acc": r["prequential"]["accuracy"], "ll": r["prequential"]["log_loss"],
                 "ece": r["prequential"]["ece"], "us": r["us_per_step"], "mb": r["bytes_per_round"] / 1e6,
                 "s": r["wall_s"]} for r in rows]
        cells = [f"{mean_std(flat, k)[0]:.3f} ± {mean_std(flat, k)[1]:.3f}" for k in ("acc", "ll", "ece")]
        lines.append(f"| {name} | {' | '.join(cells)} | {mean_std(flat, 'us')[0]:.0f} | "
                     f"{mean_std(flat, 'mb')[0]:.3f} | {mean_std(flat, 's')[0]:.0f} |")
        table[name] = rows
    RESULTS["beijing"] = table
    return [*lines, ""]


# =========================================================================== (c) cost


def part_c(quick: bool) -> list[str]:
    from streamfed.algorithms.pfedgp.client import PFedGPClient
    from streamfed.algorithms.pfedgp.network import Layout, initial_theta, omega_of
    from streamfed.algorithms.pfedgp.wire import max_chunk_numbers
    from streamfed.algorithms.urk.network import URKArch
    from streamfed.wire.message import Message

    rng = np.random.default_rng(0)
    d, n_classes = 64, 2
    budgets = [16] if quick else [16, 32, 64, 128]
    lines = ["## (c) cost of one client (digits-sized inputs, d = 64, 2 classes, network (32, 8), m = 32)", "",
             "| GP | budget per class | predict µs | learn µs (refresh every sample) | local update s | "
             "upload bytes (one chunk) | chunks per proposal | client state KiB |", "|---|---|---|---|---|---|---|---|"]
    table = []
    for inducing in (0, 16):
        for budget in budgets:
            layout = Layout(URKArch(d, (32, 8), 32), inducing)
            c = PFedGPClient(layout, initial_theta(layout, 0), omega_of(layout, 0), n_classes=n_classes,
                             budget=budget, learn_kernel=False, max_chunk_numbers=max_chunk_numbers(8192))
            X = rng.standard_normal((4 * budget, d)) + np.repeat([[0.0] * d, [1.0] * d], 2 * budget, axis=0)
            y = np.repeat([0, 1], 2 * budget)
            perm = rng.permutation(y.size)
            for i in perm[: 2 * budget]:
                c.learn(X[i], float(y[i]))
            reps = 10 if quick else 60
            pt = []
            for i in perm[:reps]:
                t = time.perf_counter()
                c.predict(X[i])
                pt.append(time.perf_counter() - t)
            lt = []
            for i in perm[2 * budget: 2 * budget + reps]:
                t = time.perf_counter()
                c.learn(X[i], float(y[i]))
                lt.append(time.perf_counter() - t)
            pred_us, learn_us = 1e6 * float(np.median(pt)), 1e6 * float(np.median(lt))
            state_kb = len(pickle.dumps(c)) / 1024.0
            c.trains = True
            t = time.perf_counter()
            c.fit()
            fit_s = time.perf_counter() - t
            ups = list(c.queue)
            sizes = [len(encode(Message("f", "a", "pfedgp.update", i + 1, 0, "k", 0, 0.0, dict(u.arrays),
                                        epoch=0))) for i, u in enumerate(ups)]
            row = {"inducing": inducing, "budget": budget, "predict_us": pred_us, "learn_us": learn_us,
                   "fit_s": fit_s, "state_kb": state_kb, "bytes_per_chunk": float(np.mean(sizes)) if sizes else 0.0,
                   "chunks": len(ups)}
            table.append(row)
            lines.append(f"| {'full' if not inducing else f'FITC M={inducing}'} | {budget} | {pred_us:.0f} | "
                         f"{learn_us:.0f} | {fit_s:.2f} | {row['bytes_per_chunk']:.0f} | {len(ups)} | {state_kb:.0f} |")
    rss = {kind: agent_rss(kind) for kind in ("predict-only", "learning")}
    RESULTS["cost"] = {"rows": table, "agent_rss_mb": rss}
    lines += ["", "Timings: medians of per-call times. Agent RSS (peak, a separate process: an `AgentCore` on the "
              f"digits stream of one client, 300 samples): {rss['predict-only']:.0f} MB without torch "
              f"(`learn_kernel=False`; torch never imported), {rss['learning']:.0f} MB with local updates "
              "(torch imported).", ""]
    return lines


AGENT_RSS = """
import sys
import numpy as np
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading
data = np.load(sys.argv[2])
X, y = data[:, :-1], data[:, -1]
keep = np.isin(y, [3, 8])
learn = sys.argv[1] == "learning"
cfg = FleetConfig(fleet="f", algorithm="pfedgp", n_inputs=64, standardise="none",
                  params={"n_classes": 10, "widths": [32, 8], "n_omega": 32, "budget": 40, "learn_kernel": learn,
                          "fit_every": 32})
agent = AgentCore(cfg, "a", 0)
for t, (x, label) in enumerate(zip(X[keep][:300], y[keep][:300])):
    agent.on_reading(Reading(f"r{t}", x, float(t), y=float(label)))
assert learn or sys.modules.get("torch") is None, "torch imported by a predict-only agent"
# VmHWM, not ru_maxrss: the latter survives exec and would report the (larger) parent's peak
print([int(v.split()[1]) / 1024.0 for v in open("/proc/self/status") if v.startswith("VmHWM")][0])
"""


def agent_rss(kind: str) -> float:
    """Peak RSS (MB) of a fresh process running one pFedGP agent core over 300 digits samples."""
    import subprocess
    import tempfile

    from sklearn.datasets import load_digits

    d = load_digits()  # read here: the agent process imports numpy and streamfed only
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "digits.npy"
        np.save(path, np.concatenate([(d.data / 16.0 - 0.3) * 2.0, d.target[:, None]], axis=1))
        out = subprocess.run([sys.executable, "-c", AGENT_RSS, kind, str(path)], capture_output=True, text=True,
                             timeout=600, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--parts", default="abc")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--beijing-steps", type=int, default=500)
    args = ap.parse_args()
    if args.quick and args.out:  # a smoke test must not overwrite the documented plots
        FIG_DIR[0] = args.out.parent
    t0 = time.perf_counter()
    lines = ["# pFedGP experiments", ""]
    if "a" in args.parts:
        lines += part_a(args.quick, 1 if args.quick else args.passes)
    if "b" in args.parts:
        lines += part_b(args.quick, args.beijing_steps)
    if "c" in args.parts:
        lines += part_c(args.quick)
    cmd = (f"benchmarks/bench_pfedgp.py{' --quick' if args.quick else ''} --parts {args.parts} "
           f"--passes {args.passes} --beijing-steps {args.beijing_steps}")
    lines.append(f"Command: `{cmd}` ({time.perf_counter() - t0:.0f} s).")
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        RESULTS["command"] = cmd
        args.out.with_suffix(".json").write_text(json.dumps(RESULTS, indent=1, default=float), encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
