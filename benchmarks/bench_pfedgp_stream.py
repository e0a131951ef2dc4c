"""pFedGP as a streaming classifier at a bounded cost, side by side with River's logistic regression recipe.

    .venv/bin/python benchmarks/bench_pfedgp_stream.py [--quick] [--out benchmarks/results/pfedgp_stream.md]

* (a) Accuracy and log loss, prequential (predict, then learn, every sample; River's `Accuracy` and
  `CrossEntropy`, probabilities clamped at 1e-15), on the streams River bundles that load offline —
  `datasets.Phishing` (1,250 × 9, binary), `datasets.Bananas` (5,300 × 2, binary), `datasets.ImageSegments`
  (2,310 × 18, 7 classes; the other bundled classification sets download at first use) — and on River's
  synthetic generators `synth.Agrawal`, `synth.Hyperplane` (5 features), `synth.Waveform` (3 classes) and
  `synth.RandomRBF` (26 classes), 2,000 samples each; and, not used while choosing the defaults (the
  linear part of the kernel, issue 34): the first 2,000 rows of the bundled `datasets.Shuttle` (9 features,
  binary), `synth.SEA` (3 features, binary, a linear threshold with 10% label noise) and `synth.LED` (7 digit
  segments and 17 irrelevant ones, 10 classes, 10% noise), 2,000 each. `PFedGPClassifier()` on its defaults against
  `StandardScaler | LogisticRegression` (one-vs-rest for more than two classes), in the same process. Three
  seeds: the pFedGP seed (bundled streams) or the generator's seed (synthetic; the recipe then runs on
  the same rows).
* (b) Cost per sample (`predict_proba_one` then `learn_one`, CPU time, one torch and one BLAS thread) on a
  26-class and a 2-class `synth.RandomRBF` stream (10 features), the defaults against the recipe in the same
  run and against pFedGP without the bound (`max_budget=None, budget=32, work_per_sample=None`: the settings
  measured in issue 34, run for fewer samples); torch's first backward pass (its lazy imports, ~2 s) is done
  before timing. The work counters (cost.py's units), refreshes and local updates are the client's own.
* (c) Why a linear stream can stay ahead (`--parts c`, seconds): on `synth.Waveform` rows (seed 0), trained on
  the first 512 or 1,000 rows and scored on rows 2,000–2,999, scikit-learn's `LogisticRegression` (C = 1,
  standardised inputs) one-vs-rest against the same binary learner arranged as a GP-Tree arranges its nodes
  (one class against the other two at the root, then the remaining pair), for each of the three roots, and the
  average of the three trees' probabilities — the structure's cost with the kernel and the sampler out of
  the way — and the effect of the 512-sample budget (the cost bound) against 1,000 rows.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from river import datasets, linear_model, metrics, multiclass, preprocessing  # noqa: E402
from river.datasets import synth  # noqa: E402

from streamfed.algorithms.pfedgp.estimator import PFedGPClassifier  # noqa: E402
from streamfed.evaluation.bench import write_section  # noqa: E402

torch.set_num_threads(1)  # two cores shared with other jobs


def recipe(n_classes: int) -> Any:
    """River's logistic regression recipe: standardised inputs, one model (one per class beyond two)."""
    lr = linear_model.LogisticRegression()
    return preprocessing.StandardScaler() | (lr if n_classes == 2 else multiclass.OneVsRestClassifier(lr))


def streams(quick: bool) -> list[tuple[str, int, Any]]:
    """(name, classes, factory(seed) → iterable of (x, y)) — bundled streams ignore the seed."""
    n = 400 if quick else 2000
    out: list[tuple[str, int, Any]] = [
        ("Phishing", 2, lambda s: datasets.Phishing()),
        ("Bananas", 2, lambda s: datasets.Bananas()),
        ("ImageSegments", 7, lambda s: datasets.ImageSegments()),
        ("Agrawal", 2, lambda s: synth.Agrawal(seed=s).take(n)),
        ("Hyperplane", 2, lambda s: synth.Hyperplane(seed=s, n_features=5).take(n)),
        ("Waveform", 3, lambda s: synth.Waveform(seed=s).take(n)),
        ("RandomRBF-26", 26, lambda s: synth.RandomRBF(seed_model=s, seed_sample=s, n_classes=26, n_features=10,
                                                       n_centroids=52).take(n)),
        # not tuned on (held out while choosing the linear part's defaults)
        ("Shuttle*", 2, lambda s: datasets.Shuttle().take(n)),
        ("SEA*", 2, lambda s: synth.SEA(variant=0, seed=s, noise=0.1).take(n)),
        ("LED*", 10, lambda s: synth.LED(seed=s, noise_percentage=0.1, irrelevant_features=True).take(n)),
    ]
    if quick:
        return [(name, k, _first(f, n)) for name, k, f in out[:3]]
    return out


def _first(make: Any, n: int) -> Any:
    return lambda s: (xy for _, xy in zip(range(n), make(s), strict=False))


def prequential(model: Any, stream: Any) -> dict[str, float]:
    acc, ce = metrics.Accuracy(), metrics.CrossEntropy()
    extreme = n = 0
    t0 = time.perf_counter()
    for x, y in stream:
        p = model.predict_proba_one(x)
        if p:
            acc.update(y, max(p, key=p.get))
            extreme += int(len(p) > 1 and any(v <= 0.0 or v >= 1.0 for v in p.values()))
        else:
            acc.update(y, None)
        ce.update(y, p)
        model.learn_one(x, y)
        n += 1
    return {"accuracy": acc.get(), "log_loss": ce.get(), "extreme": extreme, "n": n,
            "ms": 1e3 * (time.perf_counter() - t0) / max(n, 1)}


def _mean(runs: list[dict], who: str, key: str) -> float:
    return float(np.mean([r[who][key] for r in runs]))


def _spread(runs: list[dict], key: str) -> float:
    v = [r["pfedgp"][key] for r in runs]
    return float(max(v) - min(v))


def part_a(quick: bool, seeds: list[int], only: set[str] | None = None, **overrides: Any
           ) -> tuple[list[str], dict]:
    lines = ["## (a) Accuracy and log loss, prequential, against `StandardScaler | LogisticRegression`", "",
             f"Mean over seeds {seeds} (± the spread, max − min, of pFedGP over seeds); *extreme*: predictions with "
             "a probability exactly 0 or 1 (of two or more labels).", "",
             "| stream | samples | pFedGP accuracy | recipe accuracy | pFedGP log loss | recipe log loss "
             "| pFedGP extreme | pFedGP ms/sample | recipe ms/sample |", "|---|---|---|---|---|---|---|---|---|"]
    data: dict[str, Any] = {}
    for name, k, make in streams(quick):
        if only is not None and name.rstrip("*") not in only:
            continue
        runs = []
        for s in seeds:
            gp = prequential(PFedGPClassifier(seed=s, **overrides), make(s))
            lr = prequential(recipe(k), make(s))
            runs.append({"pfedgp": gp, "recipe": lr})
            print(name, s, gp, lr, flush=True)
        data[name] = runs
        acc_gp, acc_lr = _mean(runs, "pfedgp", "accuracy"), _mean(runs, "recipe", "accuracy")
        ll_gp, ll_lr = _mean(runs, "pfedgp", "log_loss"), _mean(runs, "recipe", "log_loss")
        lines.append(f"| {name} | {runs[0]['pfedgp']['n']} | {acc_gp:.3f} ± {_spread(runs, 'accuracy'):.3f} | "
                     f"{acc_lr:.3f} | {ll_gp:.3f} ± {_spread(runs, 'log_loss'):.3f} | {ll_lr:.3f} | "
                     f"{int(sum(r['pfedgp']['extreme'] for r in runs))} | {_mean(runs, 'pfedgp', 'ms'):.1f} | "
                     f"{_mean(runs, 'recipe', 'ms'):.2f} |")
    wins = sum(r["pfedgp"]["accuracy"] >= r["recipe"]["accuracy"] for v in data.values() for r in v)
    ll = sum(r["pfedgp"]["log_loss"] < r["recipe"]["log_loss"] for v in data.values() for r in v)
    total = sum(len(v) for v in data.values())
    lines += ["", f"pFedGP's accuracy at least the recipe's on {wins} of {total} runs; its log loss lower on "
              f"{ll} of {total}. *: streams not used while choosing the defaults.", ""]
    return lines, data


def cost_runs(runs: dict[str, tuple[Any, list]]) -> dict[str, dict[str, Any]]:
    """The models in lockstep — sample i of each in turn — so that the machine's load (two cores shared with
    other jobs) weighs on all of them alike: CPU time of this process (`time.process_time`) and wall time."""
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    wall: dict[str, list[float]] = {name: [] for name in runs}
    extreme = dict.fromkeys(runs, 0)
    for i in range(max(len(rows) for _, rows in runs.values())):
        for name, (model, rows) in runs.items():
            if i >= len(rows):
                continue
            x, y = rows[i]
            t, c = time.perf_counter(), time.process_time()
            p = model.predict_proba_one(x)
            model.learn_one(x, y)
            cpu[name].append(time.process_time() - c)
            wall[name].append(time.perf_counter() - t)
            extreme[name] += int(len(p) > 1 and any(v <= 0.0 or v >= 1.0 for v in p.values()))
    out: dict[str, dict[str, Any]] = {}
    for name, (model, _) in runs.items():
        ms, w = 1e3 * np.array(cpu[name]), 1e3 * np.array(wall[name])
        half = len(ms) // 2
        r: dict[str, Any] = {"n": len(ms), "ms_mean": float(ms.mean()), "ms_first_half": float(ms[:half].mean()),
                             "ms_second_half": float(ms[half:].mean()), "ms_last_100": float(ms[-100:].mean()),
                             "ms_max": float(ms.max()), "wall_ms_mean": float(w.mean()), "extreme": extreme[name]}
        gp = getattr(model, "client", None)
        if gp is not None:
            r.update({"refreshes": gp.refreshes, "local_updates": gp.n_fits, "budget": len(gp.budget),
                      "units_per_sample": (gp.refresh_units + gp.fit_units) / max(gp.n, 1),
                      "predict_units_per_sample": gp.predict_units / max(gp.n, 1)})
        out[name] = r
    return out


def warm_torch() -> None:
    """torch's first backward pass imports lazily (≈ 2 s): once, before anything is timed."""
    model = PFedGPClassifier(fit_every=8, fit_steps=1)
    for x, y in synth.Agrawal(seed=99).take(16):
        model.learn_one(x, y)


def part_b(quick: bool) -> tuple[list[str], dict]:
    n = 300 if quick else 1500
    n_old = 150 if quick else 600
    warm_torch()

    def rbf(n_: int, k: int) -> list:
        gen = synth.RandomRBF(seed_model=1, seed_sample=1, n_classes=k, n_features=10, n_centroids=2 * k)
        return list(gen.take(n_))

    rows = cost_runs({f"pFedGP, defaults, {k} classes": (PFedGPClassifier(), rbf(n, k)) for k in (26, 2)}
                     | {f"recipe, {k} classes": (recipe(k), rbf(n, k)) for k in (26, 2)})
    print(rows, flush=True)
    rows |= cost_runs({f"pFedGP unbounded (issue 34's settings), {k} classes":
                       (PFedGPClassifier(max_budget=None, budget=32, work_per_sample=None), rbf(n_old, k))
                       for k in (26, 2)})
    lines = ["## (b) Cost per sample, 26 classes against 2", "",
             "`synth.RandomRBF(seed_model=1, seed_sample=1, n_features=10, n_centroids=2k)`; predict_proba_one + "
             "learn_one per sample, CPU ms of this process (one core), the models run in lockstep (the defaults and "
             "the recipe together, then the two unbounded runs together); wall: the mean wall-clock ms; units: "
             "refresh + local-update work per sample (cost.py).", "",
             "| model | samples | CPU ms/sample mean | first half | second half | last 100 | max | wall ms | refreshes "
             "| local updates | budget | units/sample | extreme |", "|" + "---|" * 13]
    for name, r in rows.items():
        extra = (f"{r['refreshes']} | {r['local_updates']} | {r['budget']} | {r['units_per_sample']:.3g}"
                 if "refreshes" in r else "– | – | – | –")
        lines.append(f"| {name} | {r['n']} | {r['ms_mean']:.1f} | {r['ms_first_half']:.1f} | "
                     f"{r['ms_second_half']:.1f} | {r['ms_last_100']:.1f} | {r['ms_max']:.0f} | "
                     f"{r['wall_ms_mean']:.1f} | {extra} | {r['extreme']} |")
    a, b = rows["pFedGP, defaults, 26 classes"], rows["pFedGP, defaults, 2 classes"]
    lines += ["", f"Ratio 26 classes / 2 classes (defaults, mean CPU ms/sample): {a['ms_mean'] / b['ms_mean']:.2f}; "
              f"second half {a['ms_second_half'] / b['ms_second_half']:.2f}.", ""]
    return lines, rows


def part_c() -> tuple[list[str], dict]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    rows = list(synth.Waveform(seed=0).take(3000))
    keys = sorted(rows[0][0])
    X = np.array([[x[k] for k in keys] for x, _ in rows])
    y = np.array([label for _, label in rows])
    lines = ["## (c) A GP-Tree's structure against one-vs-rest, linear learners, `synth.Waveform`", "",
             "Accuracy on rows 2,000–2,999 of `synth.Waveform(seed=0)`, trained on the first n rows (inputs "
             "standardised on them); `LogisticRegression(C=1)` as the binary learner everywhere.", "",
             "| n | one-vs-rest | tree, root {0} | tree, root {1} | tree, root {2} | average of the 3 trees |",
             "|---|---|---|---|---|---|"]
    data: dict[str, Any] = {}
    for n in (512, 1000):
        mu, sd = X[:n].mean(0), X[:n].std(0)
        A, B, ya, yb = (X[:n] - mu) / sd, (X[2000:] - mu) / sd, y[:n], y[2000:]
        ovr = float(OneVsRestClassifier(LogisticRegression(C=1.0, max_iter=2000)).fit(A, ya).score(B, yb))
        trees = []
        for root in (0, 1, 2):
            rest = [c for c in (0, 1, 2) if c != root]
            p_root = LogisticRegression(C=1.0, max_iter=2000).fit(A, ya == root).predict_proba(B)[:, 1]
            m = np.isin(ya, rest)
            p_first = LogisticRegression(C=1.0, max_iter=2000).fit(A[m], ya[m] == rest[0]).predict_proba(B)[:, 1]
            P = np.zeros((len(B), 3))
            P[:, root], P[:, rest[0]], P[:, rest[1]] = p_root, (1 - p_root) * p_first, (1 - p_root) * (1 - p_first)
            trees.append(P)
        accs = [float(np.mean(P.argmax(1) == yb)) for P in trees]
        avg = float(np.mean(np.sum(trees, axis=0).argmax(1) == yb))
        data[str(n)] = {"ovr": ovr, "trees": accs, "average": avg}
        lines.append(f"| {n} | {ovr:.3f} | " + " | ".join(f"{a:.3f}" for a in accs) + f" | {avg:.3f} |")
    lines.append("")
    return lines, data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--parts", default="ab", help="a, b, c or several (c runs only when named)")
    ap.add_argument("--streams", default=None, help="part (a) on these streams only, comma-separated")
    ap.add_argument("--rbf-only", action="store_true", help="part (a) with the previous default, linear=None")
    args = ap.parse_args()
    seeds = [0] if args.quick else [0, 1, 2]
    t0 = time.perf_counter()
    lines = ["# pFedGP as a streaming classifier at a bounded cost", "",
             "pFedGP's River estimator (`PFedGPClassifier`, local-only: a fleet of one) on its defaults — budget "
             "256 per class and 512 in all, 4 Gibbs chains, a work credit of 2^25 units per sample for refreshes "
             "and local updates, probabilities mixed with the uniform at 1e-6, a kernel with a linear part (initial "
             "scale 1, learned) — against River's `StandardScaler | "
             "LogisticRegression` recipe in the same run: accuracy and log loss on River's bundled and synthetic "
             "streams, and the cost per sample at 26 classes against 2.", "",
             "Command: `.venv/bin/python benchmarks/bench_pfedgp_stream.py"
             + ("" if args.parts == "ab" else f" --parts {args.parts}")
             + ("" if args.streams is None else f" --streams {args.streams}") + (" --rbf-only" if args.rbf_only else "")
             + f" --out {args.out}` (one torch thread, "
             "one BLAS thread).", ""]
    data: dict[str, Any] = {}
    if "a" in args.parts:
        only = None if args.streams is None else set(args.streams.split(","))
        part, data["a"] = part_a(args.quick, seeds, only, **({"linear": None} if args.rbf_only else {}))
        lines += part
    if "b" in args.parts:
        part, data["b"] = part_b(args.quick)
        lines += part
    if "c" in args.parts:
        part, data["c"] = part_c()
        lines += part
    lines += [f"Wall time {time.perf_counter() - t0:.0f} s.", ""]
    write_section(args.out, lines, data, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
