"""URK-FedBNR experiments: the thesis's 1-D two-client problem, the Beijing streams, and the numpy-only agent.

    .venv/bin/python benchmarks/bench_urk.py [--quick] [--out PATH.md] [--parts abdc]

* (a) 1-D, after the thesis §3.2.1: 200 points uniform on [−5, 5], `y = f(x) + N(0, 0.5²)` with
  `f(x) = sin(1.5x) + 0.3x` (the thesis does not print its function: this one is ours), client 1 holds the
  points in [−5, 0], client 2 those in (0, 5]. Inputs scaled by 1/2.9 (the standard deviation of U[−5, 5]),
  as an agent's would be standardised. The same network (`widths = (16, 2)`, m = 64) three ways:
  *centralised* (Adam on the log evidence of all 200 points, then the exact Bayesian last layer),
  *federated, the thesis's rounds* (each round every client takes J Adam steps from the global on its own
  points, FedAvg by sample counts; then phase 2's summed statistics), and *streaming* (`urk-fedbnr`
  through `streamfed.evaluation.replay.replay`, each client's points in a random order, reservoirs of 100).
  σ, λ of the last layer: the exact evidence of the summed statistics (FedBNR's fit) in all three. RMSE of
  the predictive mean against f on 400 grid points, coverage and NLPD of 400 fresh noisy points;
  docs/img/urk_1d.png.
* (b) Beijing, 12 stations (`normalisation="online"`, every client its station, the first `steps` samples):
  `urk-fedbnr` with FedAvg and with distillation (the server holds 8 later samples of every station, 96 in
  all, never replayed), FedBNR with one Gaussian RFF kernel (D = 32, F = 65 ≈ URK's 64) at the bandwidth
  of {1, 2, 4, 8} with the lowest MSE on seed 0, and POF-MKL (its defaults); 3 seeds. MSE, NLPD, 95%
  coverage pooled over clients. Phase 1 per round: bytes of one client's proposal (its chunk messages as
  encoded) and of the global, wall time of one local fit (J = 10 Adam steps on a full reservoir of 256) and
  of the server's distillation (20 steps, 12 proposals), medians.
* (d) Another bundled real dataset through the CSV path: scikit-learn's diabetes (442 rows, 10 inputs), written
  to a CSV with a client column made by the thesis's split (rows sorted by the input most correlated with the
  target, cut into 2C chunks, 2 chunks per client at random; C = 4; each client's rows in a random order),
  read back by `csv_fleet(normalisation="paper")` (whole-file constants; 110-sample streams are too short for
  causal scales): URK-FedBNR vs RFF FedBNR (best of {1, 2, 4, 8}, D = 32)
  vs FedAvg of the same MLP (`widths = (32, 8)`) with a linear head (every client: predict, keep the sample;
  every 32 samples 10 Adam steps on its last 128 on the squared error; then the server averages the clients'
  weights by their sample counts and sends the average back). Prequential MSE (and NLPD, coverage where there
  is a variance), 3 seeds (the split's pairing and the orders change with the seed).
* (c) Agents on station 0 (2000 samples), each in its own process: per-sample `learn` (which predicts
  first) + `take_update`, and the process's peak RSS: URK-FedBNR with torch hidden (numpy network: predicts
  and contributes statistics), RFF FedBNR (D = 32, one kernel), and URK-FedBNR with torch (trains: local
  fits every `fit_every` samples, amortised).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from streamfed.algorithms.fedbnr.evidence import fit_hyperparameters  # noqa: E402
from streamfed.algorithms.urk.network import URKArch, URKWeights, features, initial_weights, omega  # noqa: E402
from streamfed.algorithms.urk.training import fit_local  # noqa: E402
from streamfed.evaluation.datasets import ClientStream, Fleet, load_beijing  # noqa: E402
from streamfed.evaluation.replay import AlgorithmConfig, replay  # noqa: E402

torch.set_num_threads(1)
IMG = ROOT / "docs" / "img"
FIG_DIR = [IMG]  # where part (a) puts its figure: docs/img, except for a --quick run with --out (beside it)
RESULTS: dict[str, Any] = {}
Z95 = 1.959963984540054


def f_true(x: np.ndarray) -> np.ndarray:
    return np.sin(1.5 * x) + 0.3 * x


def blr(S: np.ndarray, b: np.ndarray, n: float, q: float) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Phase 2 from the sums `S = ΦᵀΦ, b = Φᵀy, n, q = yᵀy`: σ, λ by the exact evidence (FedBNR's fit), then
    `(σ, λ, A⁻¹, m)`."""
    sigma, lam, _ = fit_hyperparameters(S, b, n, q)
    A = S / sigma**2 + np.eye(S.shape[0]) / lam**2
    Ainv = np.linalg.inv(A)
    return sigma, lam, Ainv, Ainv @ b / sigma**2


def predictive(phi: np.ndarray, sigma: float, Ainv: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return phi @ m, sigma**2 + np.einsum("ti,ij,tj->t", phi, Ainv, phi)


def scores(mean: np.ndarray, var: np.ndarray, y: np.ndarray) -> dict[str, float]:
    nlpd = 0.5 * np.log(2 * np.pi * var) + 0.5 * (y - mean) ** 2 / var
    return {"mse": float(np.mean((y - mean) ** 2)), "nlpd": float(np.mean(nlpd)),
            "coverage95": float(np.mean(np.abs(y - mean) <= Z95 * np.sqrt(var)))}


# =========================================================================== (a) 1-D, two clients


def part_a(quick: bool) -> list[str]:
    rng = np.random.default_rng(0)
    x = rng.uniform(-5, 5, 200)
    y = f_true(x) + 0.5 * rng.standard_normal(200)
    scale = 2.9
    u = (x / scale)[:, None]
    grid = np.linspace(-5, 5, 400)
    xt = rng.uniform(-5, 5, 400)
    yt = f_true(xt) + 0.5 * rng.standard_normal(400)
    arch = URKArch(n_inputs=1, widths=(16, 2), n_omega=64)
    seed = 0
    om = omega(arch, seed)
    w0 = initial_weights(arch, seed, lengthscale=1.0, sigma=0.5, lam=1.0)
    rounds, J, lr = (8, 10, 0.02) if quick else (30, 10, 0.02)
    left = x <= 0
    out: dict[str, Any] = {}
    curves = {}

    def evaluate(name: str, w: URKWeights, sums: tuple[np.ndarray, np.ndarray, float, float] | None,
                 seconds: float) -> None:
        if sums is None:  # phase 2 over every point: the summed statistics of both clients
            phi = features(w, om, u)
            sums = (phi.T @ phi, phi.T @ y, float(len(y)), float(y @ y))
        sigma, lam, Ainv, m = blr(*sums)
        mg, vg = predictive(features(w, om, (grid / scale)[:, None]), sigma, Ainv, m)
        mt, vt = predictive(features(w, om, (xt / scale)[:, None]), sigma, Ainv, m)
        s = scores(mt, vt, yt)
        s.update(rmse_f=float(np.sqrt(np.mean((mg - f_true(grid)) ** 2))), sigma=sigma, lam=lam, seconds=seconds)
        out[name] = s
        curves[name] = (mg, vg)

    t = time.perf_counter()
    wc = fit_local(w0, om, u, y, steps=rounds * J, learning_rate=lr)
    assert wc is not None
    evaluate("centralised", wc, None, time.perf_counter() - t)

    t = time.perf_counter()
    wg = w0
    for _ in range(rounds):
        props = [fit_local(wg, om, u[mask], y[mask], steps=J, learning_rate=lr) for mask in (left, ~left)]
        ns = [int(left.sum()), int((~left).sum())]
        vec = sum(n * p.to_vector() for n, p in zip(ns, props, strict=True) if p is not None) / sum(ns)
        wg = URKWeights.from_vector(arch, vec)
    evaluate("federated (thesis rounds, FedAvg)", wg, None, time.perf_counter() - t)

    # streaming: urk-fedbnr through the replay, each client's points in a random order
    streams = []
    for c, mask in enumerate((left, ~left)):
        o = rng.permutation(int(mask.sum()))
        streams.append(ClientStream(f"c{c}", u[mask][o], y[mask][o], ("x",)))
    fleet = Fleet(tuple(streams), dataset="thesis-1d", normalisation="none", split="range", seed=0)
    params = {"widths": [16, 2], "n_omega": 64, "lengthscale": 1.0, "sigma": 0.5, "lam": 1.0, "min_upload": 10,
              "reservoir": 100, "fit_every": 20, "fit_steps": J, "learning_rate": lr, "min_proposal_weight": 20,
              "proposal_quorum": 1.0}
    t = time.perf_counter()
    res = replay(fleet, "urk-fedbnr", AlgorithmConfig(n_kernels=1, n_features=8, params={"urk-fedbnr": params}),
                 seed=seed)
    server = res.arrangement.aggregations[0].server  # type: ignore[union-attr]
    ws = server.weights
    # phase 2 from the last global's own sums: the reservoirs re-embedded plus later samples, under the last
    # network (a client's last samples below the privacy floor are not in them)
    st = server.stats
    evaluate("streaming (urk-fedbnr replay)", ws, (st.S[0], st.b[0], st.n, st.q), time.perf_counter() - t)
    out["streaming (urk-fedbnr replay)"].update(epochs=int(server.epoch), global_n=float(server.stats.n))
    RESULTS["a"] = out

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    for ax, (name, (mg, vg)) in zip(axes, curves.items(), strict=True):
        sd = np.sqrt(vg)
        ax.fill_between(grid, mg - Z95 * sd, mg + Z95 * sd, color="tab:red", alpha=0.2, label="95% band")
        ax.plot(grid, f_true(grid), "b-", lw=1, label="f")
        ax.plot(grid, mg, "g-", lw=1.5, label="mean")
        ax.scatter(x[left], y[left], s=6, c="k", label="client 1")
        ax.scatter(x[~left], y[~left], s=6, c="tab:orange", label="client 2")
        ax.set_title(f"{name}\nRMSE vs f {out[name]['rmse_f']:.3f}, cov95 {out[name]['coverage95']:.2f}", fontsize=9)
        ax.set_xlabel("x")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    FIG_DIR[0].mkdir(parents=True, exist_ok=True)
    fig.savefig(FIG_DIR[0] / "urk_1d.png", dpi=110)
    plt.close(fig)

    lines = ["## (a) The thesis's 1-D two-client problem", "",
             f"200 points, noise 0.5, client 1 on [−5, 0], client 2 on (0, 5]; network widths (16, 2), m = 64; "
             f"{rounds} rounds × J = {J} Adam steps (lr {lr}); centralised: {rounds * J} steps. "
             "Figure: docs/img/urk_1d.png.", "",
             "| model | RMSE of the mean vs f | test MSE | NLPD | 95% coverage | σ | λ | s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, s in out.items():
        lines.append(f"| {name} | {s['rmse_f']:.3f} | {s['mse']:.3f} | {s['nlpd']:.3f} | {s['coverage95']:.3f} | "
                     f"{s['sigma']:.3f} | {s['lam']:.3g} | {s['seconds']:.1f} |")
    st = out["streaming (urk-fedbnr replay)"]
    lines += ["", f"Streaming: {st['epochs']} kernel versions; the last global sums {st['global_n']:.0f} samples.", ""]
    return lines


# =========================================================================== (b) Beijing


def pooled(res: Any) -> dict[str, float | None]:
    m = np.concatenate(res.means)
    y = np.concatenate(res.ys)
    v = np.concatenate(res.variances) if res.variances else np.full_like(m, np.nan)
    ok = np.isfinite(m)
    out: dict[str, float | None] = {"mse": float(np.mean((m[ok] - y[ok]) ** 2))}
    okv = ok & np.isfinite(v) & (v > 0)
    if okv.sum() > 0:
        s = scores(m[okv], v[okv], y[okv])
        out.update(nlpd=s["nlpd"], coverage95=s["coverage95"])
    else:
        out.update(nlpd=None, coverage95=None)
    return out


def part_b(quick: bool) -> list[str]:
    from streamfed.algorithms import get
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.message import Message, encode

    steps = 150 if quick else 600
    seeds = [0] if quick else [0, 1, 2]
    full = load_beijing("online", "station", steps=steps + 8)
    fleet = Fleet(tuple(ClientStream(s.name, s.X[:steps], s.y[:steps], s.feature_names) for s in full.streams),
                  dataset="beijing-air", normalisation="online", split="station", seed=0)
    Xkd = np.concatenate([s.X[steps:steps + 8] for s in full.streams])
    ykd = np.concatenate([s.y[steps:steps + 8] for s in full.streams])
    base = {"min_upload": 32}
    kd = {"aggregation": "distill", "distill_inputs": [list(map(float, r)) for r in Xkd],
          "distill_targets": list(map(float, ykd))}
    rows: dict[str, list[dict[str, Any]]] = {}

    def run(label: str, name: str, cfg: AlgorithmConfig, seed: int) -> dict[str, Any]:
        t = time.perf_counter()
        res = replay(fleet, name, cfg, seed=seed)
        r: dict[str, Any] = {"seed": seed, **pooled(res), "wall_s": time.perf_counter() - t}
        agg = res.arrangement.aggregations[0] if res.arrangement is not None else None
        srv = getattr(agg, "server", None)
        if name == "urk-fedbnr" and srv is not None:
            r["epochs"] = int(srv.epoch)
        rows.setdefault(label, []).append(r)
        print(label, r, flush=True)
        return r

    for seed in seeds:
        run("urk-fedbnr (FedAvg)", "urk-fedbnr", AlgorithmConfig(params={"urk-fedbnr": base}), seed)
        run("urk-fedbnr (distillation)", "urk-fedbnr", AlgorithmConfig(params={"urk-fedbnr": {**base, **kd}}), seed)
    bws = [1.0, 2.0, 4.0, 8.0]
    probe = {bw: run(f"fedbnr bw {bw:g} (seed 0 probe)", "fedbnr",
                     AlgorithmConfig(kernels=(f"gaussian:{bw}",), n_features=32), 0)["mse"] for bw in bws}
    best = min(probe, key=lambda b: probe[b])
    label = f"fedbnr, RFF bandwidth {best:g} (best of {', '.join(f'{b:g}' for b in bws)})"
    rows[label] = [r for r in rows.pop(f"fedbnr bw {best:g} (seed 0 probe)")]
    for bw in bws:
        rows.pop(f"fedbnr bw {bw:g} (seed 0 probe)", None)
    for seed in seeds[1:]:
        run(label, "fedbnr", AlgorithmConfig(kernels=(f"gaussian:{best}",), n_features=32), seed)
    for seed in seeds:
        run("pofmkl (defaults)", "pofmkl", AlgorithmConfig(), seed)

    # phase 1 per round: bytes and wall time
    alg = get("urk-fedbnr")
    cfg = FleetConfig(fleet="bench", algorithm="urk-fedbnr", n_inputs=fleet.n_inputs, standardise="none",
                      params={**base, "fit_every": 256, "reservoir": 256})
    learner = alg.learner(cfg, "c0", 0)
    s0 = load_beijing("online", "station", steps=256)[0]
    X0, y0 = s0.X, s0.y
    t_fit = []
    for xi, yi in zip(X0[:256], y0[:256], strict=True):
        learner.learn(xi, float(yi))
    client = learner.client  # type: ignore[attr-defined]
    Xr, yr = client.reservoir
    for _ in range(3 if quick else 7):
        t = time.perf_counter()
        fit_local(client.weights, client.omega, Xr, yr, steps=10, learning_rate=0.01)
        t_fit.append(time.perf_counter() - t)
    ups = []
    while (up := learner.take_update()) is not None:
        ups.append(up)
    kv = alg.kernel_version(cfg)
    chunk_bytes = [len(encode(Message("bench", "c0", "urk.update", u.seq, 0, kv, u.n_samples, 0.0, dict(u.arrays),
                                      epoch=u.epoch))) for u in ups if u.arrays["chunk"].size]
    stats_bytes = [len(encode(Message("bench", "c0", "urk.update", u.seq, 0, kv, u.n_samples, 0.0, dict(u.arrays),
                                      epoch=u.epoch))) for u in ups if not u.arrays["chunk"].size]
    agg = alg.aggregation(cfg)
    g_bytes = len(encode(agg.global_message("bench", "aggregator", kv)))
    from streamfed.algorithms.urk.training import distill

    props = [URKWeights.from_vector(client.weights.arch, client.weights.to_vector()
                                    + 0.01 * np.random.default_rng(i).standard_normal(client.weights.arch.n_params))
             for i in range(12)]
    t_kd = []
    for _ in range(3 if quick else 5):
        t = time.perf_counter()
        distill(client.weights, props, client.omega, Xkd, ykd, steps=20, learning_rate=0.01)
        t_kd.append(time.perf_counter() - t)
    phase1 = {"n_params": client.weights.arch.n_params, "chunks_per_proposal": len(chunk_bytes),
              "proposal_bytes": int(sum(chunk_bytes)), "stats_upload_bytes": int(stats_bytes[0]) if stats_bytes else 0,
              "global_bytes": g_bytes, "fleet_upload_bytes_per_round": 12 * int(sum(chunk_bytes)),
              "local_fit_s": float(np.median(t_fit)), "distill_s": float(np.median(t_kd))}
    RESULTS["b"] = {"steps": steps, "seeds": seeds, "fedbnr_probe_mse": {str(k): v for k, v in probe.items()},
                    "rows": rows, "phase1": phase1}

    def fmt(v: Any, spec: str) -> str:
        return "—" if v is None else format(v, spec)

    lines = ["## (b) Beijing, 12 stations", "",
             f"First {steps} samples of every station, `normalisation=\"online\"`, seeds {seeds}; pooled over "
             "clients (prequential). URK-FedBNR: defaults (since issue 34 `widths = ()`, a learned lengthscale per "
             "input; m = 32, reservoir 256, a local fit every 64 samples, J = 10 Adam steps at 0.1, "
             "`min_upload = 32`). FedBNR seed-0 MSE by bandwidth: "
             + ", ".join(f"{k:g}: {v:.4f}" for k, v in probe.items()) + ".", "",
             "| model | MSE | ± std | NLPD | 95% coverage | kernel versions | wall s (one seed) |",
             "|---|---|---|---|---|---|---|"]
    for name, rs in rows.items():
        mse = [r["mse"] for r in rs]
        nl = [r["nlpd"] for r in rs if r["nlpd"] is not None]
        cv = [r["coverage95"] for r in rs if r["coverage95"] is not None]
        ep = [r["epochs"] for r in rs if "epochs" in r]
        lines.append(f"| {name} | {np.mean(mse):.4f} | {np.std(mse):.4f} | {fmt(np.mean(nl) if nl else None, '.3f')} | "
                     f"{fmt(np.mean(cv) if cv else None, '.3f')} | {'—' if not ep else f'{np.mean(ep):.1f}'} | "
                     f"{rs[0]['wall_s']:.1f} |")
    p = phase1
    lines += ["", f"Phase 1 per round (d = {fleet.n_inputs}, {p['n_params']} numbers per proposal): one client's "
              f"proposal = {p['chunks_per_proposal']} chunk messages, {p['proposal_bytes']} bytes encoded "
              f"(the fleet's 12: {p['fleet_upload_bytes_per_round']} bytes); a statistics upload "
              f"{p['stats_upload_bytes']} bytes; the global {p['global_bytes']} bytes. Wall time: a local fit "
              f"(10 Adam steps, reservoir 256) {1e3 * p['local_fit_s']:.0f} ms; the server's distillation "
              f"(20 steps, 12 proposals, 96 samples) {1e3 * p['distill_s']:.0f} ms; FedAvg is a weighted mean.", ""]
    return lines


# =========================================================================== (d) a bundled dataset through the CSV path


def thesis_split_csv(path: Path, X: np.ndarray, y: np.ndarray, names: list[str], clients: int, seed: int) -> None:
    """The thesis's split: sort by the input most correlated with y, 2·clients chunks, 2 per client at random."""
    rng = np.random.default_rng(seed)
    best = int(np.argmax([abs(np.corrcoef(X[:, j], y)[0, 1]) for j in range(X.shape[1])]))
    order = np.argsort(X[:, best], kind="stable")
    chunks = np.array_split(order, 2 * clients)
    pick = rng.permutation(2 * clients)
    lines = [",".join(["client", *names, "y"])]
    for c in range(clients):
        rows = np.concatenate([chunks[pick[2 * c]], chunks[pick[2 * c + 1]]])
        for r in rng.permutation(rows):
            lines.append(",".join([f"c{c}", *(repr(float(v)) for v in X[r]), repr(float(y[r]))]))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def fedavg_mlp(fleet: Fleet, widths: tuple[int, ...], seed: int, every: int = 32, window: int = 128, steps: int = 10,
               lr: float = 0.01) -> dict[str, Any]:
    """FedAvg of an MLP with a linear head, streaming: predict each sample, and every `every` steps each client
    takes `steps` Adam steps on its last `window` samples, then the weights are averaged by sample counts."""
    torch.manual_seed(seed)
    d = fleet.n_inputs
    sizes = (d, *widths)
    layers: list[torch.nn.Module] = []
    for i in range(len(widths)):
        layers += [torch.nn.Linear(sizes[i], sizes[i + 1]).double(), torch.nn.Tanh()]
    layers.append(torch.nn.Linear(sizes[-1], 1).double())
    glob = torch.nn.Sequential(*layers)
    models = [copy.deepcopy(glob) for _ in fleet.streams]
    opts = [torch.optim.Adam(m.parameters(), lr=lr) for m in models]
    t_max = max(len(s.y) for s in fleet.streams)
    sq, seen = [], [0] * len(models)
    for t in range(t_max):
        for c, s in enumerate(fleet.streams):
            if t >= len(s.y):
                continue
            with torch.no_grad():
                pred = float(models[c](torch.tensor(s.X[t][None, :]))[0, 0])
            sq.append((pred - float(s.y[t])) ** 2)
            seen[c] = t + 1
        if (t + 1) % every == 0:
            for c, s in enumerate(fleet.streams):
                lo = max(0, seen[c] - window)
                Xw, yw = torch.tensor(s.X[lo:seen[c]]), torch.tensor(s.y[lo:seen[c]])
                for _ in range(steps):
                    opts[c].zero_grad()
                    loss = torch.mean((models[c](Xw)[:, 0] - yw) ** 2)
                    loss.backward()
                    opts[c].step()
            total = float(sum(seen))
            with torch.no_grad():
                for pg, *pcs in zip(glob.parameters(), *[m.parameters() for m in models], strict=True):
                    pg.copy_(sum(pc * (n / total) for pc, n in zip(pcs, seen, strict=True)))
                for m in models:
                    m.load_state_dict(glob.state_dict())
    return {"mse": float(np.mean(sq)), "nlpd": None, "coverage95": None}


def part_d(quick: bool) -> list[str]:
    import tempfile

    from sklearn.datasets import load_diabetes

    from streamfed.evaluation.datasets import csv_fleet

    data = load_diabetes()
    X, y = np.asarray(data.data), np.asarray(data.target, dtype=np.float64)
    names = [str(n) for n in data.feature_names]
    seeds = [0] if quick else [0, 1, 2]
    clients = 4
    urk = {"min_upload": 16, "fit_every": 32, "reservoir": 128, "min_proposal_weight": 64, "widths": [32, 8],
           "n_omega": 32}
    rows: dict[str, list[dict[str, Any]]] = {}
    probe: dict[float, float] = {}
    bws = [1.0, 2.0, 4.0, 8.0]
    tmp = Path(tempfile.mkdtemp())
    for seed in seeds:
        path = tmp / f"diabetes-split{seed}.csv"
        thesis_split_csv(path, X, y, names, clients, seed)
        fleet = csv_fleet(path, "y", client_column="client", normalisation="paper")
        for label, name, cfg in (("urk-fedbnr (FedAvg)", "urk-fedbnr", AlgorithmConfig(params={"urk-fedbnr": urk})),
                                 ("urk-fedbnr-local (no federation)", "urk-fedbnr-local",
                                  AlgorithmConfig(params={"urk-fedbnr-local": urk}))):
            res = replay(fleet, name, cfg, seed=seed)
            rows.setdefault(label, []).append({"seed": seed, **pooled(res)})
        if seed == 0:
            for bw in bws:
                res = replay(fleet, "fedbnr", AlgorithmConfig(kernels=(f"gaussian:{bw}",), n_features=32), seed=0)
                probe[bw] = float(pooled(res)["mse"])  # type: ignore[arg-type]
        best = min(probe, key=lambda b: probe[b])
        res = replay(fleet, "fedbnr", AlgorithmConfig(kernels=(f"gaussian:{best}",), n_features=32), seed=seed)
        rows.setdefault(f"fedbnr, RFF bandwidth {best:g} (best of 1, 2, 4, 8)", []).append({"seed": seed,
                                                                                           **pooled(res)})
        rows.setdefault("FedAvg of the MLP (32, 8) + linear head", []).append(
            {"seed": seed, **fedavg_mlp(fleet, (32, 8), seed)})
        print(seed, {k: v[-1] for k, v in rows.items()}, flush=True)
    RESULTS["d"] = {"dataset": "sklearn diabetes", "clients": clients, "seeds": seeds, "rows": rows,
                    "fedbnr_probe_mse": {str(k): v for k, v in probe.items()}}
    lines = ["## (d) scikit-learn's diabetes through the CSV path, the thesis's split", "",
             f"442 rows, 10 inputs, {clients} clients of 2 chunks each (sorted by the input most correlated with the "
             f"target), `csv_fleet(normalisation=\"paper\")` (whole-file constants: 110-sample streams are too "
             f"short for causal scales), seeds {seeds}; prequential, pooled over clients. "
             "URK-FedBNR: widths (32, 8), m = 32, a local fit every 32 samples on a reservoir of 128, "
             "`min_upload = 16`. FedBNR seed-0 MSE by bandwidth: "
             + ", ".join(f"{k:g}: {v:.4f}" for k, v in probe.items()) + ".", "",
             "| model | MSE | ± std | NLPD | 95% coverage |", "|---|---|---|---|---|"]
    for name, rs in rows.items():
        mse = [r["mse"] for r in rs]
        nl = [r["nlpd"] for r in rs if r["nlpd"] is not None]
        cv = [r["coverage95"] for r in rs if r["coverage95"] is not None]
        lines.append(f"| {name} | {np.mean(mse):.4f} | {np.std(mse):.4f} | "
                     f"{'—' if not nl else f'{np.mean(nl):.3f}'} | {'—' if not cv else f'{np.mean(cv):.3f}'} |")
    lines.append("")
    return lines


# =========================================================================== (c) numpy agent


AGENT_CODE = r"""
import os, resource, sys, time
os.environ["OPENBLAS_NUM_THREADS"] = "1"
hide = sys.argv[2] == "hide"
if hide:
    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is hidden")
    sys.meta_path.insert(0, NoTorch())
import numpy as np
from streamfed import algorithms
from streamfed.fleet.config import FleetConfig
name = sys.argv[1]
data = np.load(sys.argv[3])
X, Y = data["X"], data["y"]
kw = {"kernels": ["gaussian:4.0"], "n_features": 32} if name == "fedbnr" else {}
cfg = FleetConfig(fleet="bench", algorithm=name, n_inputs=X.shape[1], standardise="none", **kw)
if not hide:  # torch loaded and its first backward pass done before timing: a long-running agent pays it once
    import torch
    torch.set_num_threads(1)
    from streamfed.algorithms.urk.network import URKArch, initial_weights, omega
    from streamfed.algorithms.urk.training import fit_local
    a = URKArch(n_inputs=X.shape[1], widths=(4,), n_omega=4)
    fit_local(initial_weights(a, 0), omega(a, 0), X[:8], Y[:8], steps=2)
def rss_mb():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024
before = rss_mb()
learner = algorithms.get(name).learner(cfg, "c0", 0)
learner.warm_up(np.zeros(X.shape[1]))
ts = []
for x, y in zip(X, Y):
    t = time.perf_counter_ns()
    learner.learn(x, float(y))
    learner.take_update()
    ts.append(time.perf_counter_ns() - t)
ts = np.array(ts[100:]) / 1e3
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
loaded = int(sys.modules.get("torch") is not None)
print(f"{np.median(ts):.1f} {np.mean(ts):.1f} {rss:.1f} {loaded} {before:.1f} {rss_mb():.1f}")
"""


def part_c(quick: bool) -> list[str]:
    import tempfile

    n = 500 if quick else 2000
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    rows = {}
    s0 = load_beijing("online", "station", steps=n)[0]
    tmp = Path(tempfile.mkdtemp()) / "station0.npz"
    np.savez(tmp, X=np.asarray(s0.X), y=np.asarray(s0.y))  # the agents read this, not the whole dataset
    for label, name, mode in (("urk-fedbnr, numpy only (torch hidden)", "urk-fedbnr", "hide"),
                              ("fedbnr, RFF D = 32 (one kernel)", "fedbnr", "hide"),
                              ("urk-fedbnr with torch (trains)", "urk-fedbnr", "torch")):
        out = subprocess.run([sys.executable, "-c", AGENT_CODE, name, mode, str(tmp)], capture_output=True, text=True,
                             env=env, cwd=ROOT, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        med, mean, rss, torch_loaded, before, after = out.stdout.split()
        rows[label] = {"median_us": float(med), "mean_us": float(mean), "peak_rss_mb": float(rss),
                       "torch_loaded": bool(int(torch_loaded)), "rss_before_learner_mb": float(before),
                       "rss_after_run_mb": float(after)}
    RESULTS["c"] = {"samples": n, "rows": rows}
    lines = ["## (c) One agent: per-sample cost and memory", "",
             f"Station 0, {n} samples (`learn` + `take_update`, first 100 untimed), each agent in its own process "
             "reading the samples from a small .npz (peak RSS of the whole process: Python, numpy, numba, "
             "streamfed, and torch where loaded). With torch, its first backward pass is done before timing.", "",
             "| agent | median µs/sample | mean µs/sample | RSS before the learner MB | RSS after the run MB | "
             "peak RSS MB | torch loaded |", "|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        lines.append(f"| {label} | {r['median_us']:.0f} | {r['mean_us']:.0f} | {r['rss_before_learner_mb']:.0f} | "
                     f"{r['rss_after_run_mb']:.0f} | {r['peak_rss_mb']:.0f} | {'yes' if r['torch_loaded'] else 'no'} |")
    lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--parts", default="abdc")
    args = ap.parse_args()
    if args.quick and args.out:  # a smoke test must not overwrite the documented figure
        FIG_DIR[0] = args.out.parent
    t0 = time.perf_counter()
    lines = ["# URK-FedBNR experiments", ""]
    for p, fn in (("a", part_a), ("b", part_b), ("d", part_d), ("c", part_c)):
        if p in args.parts:
            t = time.perf_counter()
            lines += fn(args.quick)
            RESULTS.setdefault("seconds", {})[p] = time.perf_counter() - t
    cmd = f"benchmarks/bench_urk.py{' --quick' if args.quick else ''} --parts {args.parts}"
    lines.append(f"Command: `{cmd}` ({time.perf_counter() - t0:.0f} s, `OPENBLAS_NUM_THREADS=1`, one torch thread).")
    text = "\n".join(lines) + "\n"
    RESULTS["meta"] = {"quick": bool(args.quick), "command": cmd}
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        args.out.with_suffix(".json").write_text(json.dumps(RESULTS, indent=1, allow_nan=False), encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
