"""Classification through `streamfed replay`, against River's own classifiers on the same rows.

    .venv/bin/python benchmarks/bench_classification_replay.py [--rows 4000] [--clients 4] [--out PATH.md]

River's bundled binary classification streams — `synth.SEA`, `synth.Agrawal`, `synth.Hyperplane` (5 features)
and `datasets.Bananas` — are written to CSV files (the first `--rows` samples, seed 1; Bananas whole), row `i`
going to client `c{i mod --clients}`. Each file is then replayed by the real command, one classifier at a time:

    streamfed replay --dataset FILE.csv --target label --client-column client -a pfedgp --param pfedgp.n_classes=2
    streamfed replay --dataset FILE.csv --target label --client-column client -a pvi --param pvi.likelihood=bernoulli

(federated over the clients; inputs standardised online from each client's past, the label never; each client's
first two rows only start its statistics and are not scored). River's classifiers learn the same rows, scored
on the same rows (every client's third row on), prequentially (predict, then learn): the recipe
`StandardScaler | LogisticRegression`, `GaussianNB` and `HoeffdingTreeClassifier`, each once as one model over
the file in row order ("pooled": every client's data in one place, the federation's upper reference) and once
per client ("local"). Accuracy, log loss and expected calibration error (the agents' `ClassificationStats`:
15 equal-width bins on the top probability), one seed.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamfed.fleet.telemetry import ClassificationStats  # noqa: E402

WARMUP = 2  # rows per client the replay's online standardisation only starts its statistics with


def streams(rows: int) -> dict[str, Any]:
    from river import datasets
    from river.datasets import synth

    return {"SEA": synth.SEA(seed=1).take(rows), "Agrawal": synth.Agrawal(seed=1).take(rows),
            "Hyperplane": synth.Hyperplane(seed=1, n_features=5).take(rows), "Bananas": datasets.Bananas()}


def write_csv(path: Path, samples: list[tuple[dict, Any]], clients: int) -> None:
    keys = sorted(samples[0][0])
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["client", *[f"x_{k}" for k in keys], "label"])
        for i, (x, y) in enumerate(samples):
            w.writerow([f"c{i % clients}", *[x[k] for k in keys], int(y)])


def river_models() -> dict[str, Any]:
    from river import linear_model, naive_bayes, preprocessing, tree

    return {"River StandardScaler + LogisticRegression":
            lambda: preprocessing.StandardScaler() | linear_model.LogisticRegression(),
            "River GaussianNB": naive_bayes.GaussianNB,
            "River HoeffdingTreeClassifier": tree.HoeffdingTreeClassifier}


def score_river(make: Any, samples: list[tuple[dict, Any]], clients: int, pooled: bool) -> dict[str, float]:
    stats = ClassificationStats()
    models = [make()] if pooled else [make() for _ in range(clients)]
    seen = [0] * clients
    for i, (x, y) in enumerate(samples):
        c = i % clients
        model = models[0 if pooled else c]
        label = int(y)
        if seen[c] >= WARMUP:
            p = model.predict_proba_one(x)
            p1 = float(p.get(1, p.get(True, 0.0)))
            p0 = float(p.get(0, p.get(False, 0.0)))
            total = p0 + p1
            proba = np.array([0.5, 0.5]) if total <= 0 else np.array([p0, p1]) / total
            stats.observe(label, proba)
        model.learn_one(x, label)
        seen[c] += 1
    return {"accuracy": stats.accuracy, "log_loss": stats.log_loss, "ece": stats.expected_calibration_error,
            "n": stats.n}


REPLAYS = {"pfedgp": ["-a", "pfedgp", "--param", "pfedgp.n_classes=2"],
           "pvi (Bernoulli)": ["-a", "pvi", "--param", "pvi.likelihood=bernoulli"]}


def replay(path: Path, args: list[str], out: Path) -> tuple[dict[str, Any], str, float]:
    cmd = ["streamfed", "replay", "--dataset", str(path), "--target", "label", "--client-column", "client",
           *args, "--out", str(out), "--no-plots"]
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "streamfed.cli", *cmd[1:]], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t
    data = json.loads((out / "results.json").read_text())
    (alg,) = data["algorithms"].values()
    c = alg["classification"]
    return {**c, "n": data["dataset"]["samples"]}, " ".join(cmd), wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--work", type=Path, default=Path("out/bench_classification"))
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"rows": a.rows, "clients": a.clients, "datasets": {}}
    lines = ["# Classification replays: streamfed against River classifiers", "",
             f"Command: `.venv/bin/python benchmarks/bench_classification_replay.py --rows {a.rows} "
             f"--clients {a.clients}`", ""]
    for name, stream in streams(a.rows).items():
        samples = list(stream)
        path = a.work / f"{name.lower()}.csv"
        write_csv(path, samples, a.clients)
        rows: dict[str, Any] = {}
        for label, args in REPLAYS.items():
            rows[f"streamfed {label}, federated"], cmd, wall = replay(path, args, a.work / f"{name}-{label[:4]}")
            rows[f"streamfed {label}, federated"]["command"] = cmd
            rows[f"streamfed {label}, federated"]["wall_s"] = wall
        for label, make in river_models().items():
            rows[f"{label}, pooled"] = score_river(make, samples, a.clients, pooled=True)
            rows[f"{label}, local"] = score_river(make, samples, a.clients, pooled=False)
        results["datasets"][name] = {"samples": len(samples), "rows": rows}
        lines += [f"### {name} ({len(samples)} samples, {a.clients} clients)", "",
                  "| model | accuracy | log loss | ECE | scored |", "|---|---|---|---|---|"]
        for model, r in rows.items():
            lines.append(f"| {model} | {r['accuracy']:.4f} | {r['log_loss']:.4f} | {r['ece']:.4f} | {r['n']} |")
        lines.append("")
        print("\n".join(lines[-len(rows) - 4:]), flush=True)
    text = "\n".join(lines)
    if a.out is not None:
        a.out.write_text(text + "\n")
        a.out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    print(text)


if __name__ == "__main__":
    main()
