"""The layout keeps its promises: the cores, the runtime, the replay and the CLI know no algorithm by name,
nothing in the repository points outside it, and the plug-in registry is consistent."""

import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

from streamfed import algorithms
from streamfed.algorithms.base import Aggregation, Learner
from streamfed.algorithms.calibration import CalibratedLearner
from streamfed.fleet.config import FleetConfig
from streamfed.wire.topics import Channel

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "streamfed"
# Modules that must go through the plug-in contract only.
GENERIC = [*sorted((PKG / "wire").glob("*.py")), *sorted((PKG / "fleet").glob("*.py")),
           *sorted((PKG / "runtime").rglob("*.py")), PKG / "evaluation" / "replay.py", PKG / "evaluation" / "report.py",
           *sorted((PKG / "cli").glob("*.py")), PKG / "demo.py"]


def code_without_docs(path: Path) -> str:
    """The module's code tokens: comments, docstrings and doctests dropped (they may name an algorithm as
    an example); every other string literal and identifier kept."""
    out, prev = [], tokenize.INDENT
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if tok.type == tokenize.COMMENT:
            continue
        # a string that is a statement of its own (after an indent, a newline or at the start) is a docstring
        if tok.type == tokenize.STRING and prev in (tokenize.INDENT, tokenize.NEWLINE, tokenize.DEDENT, tokenize.NL):
            prev = tok.type
            continue
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            prev = tok.type
        out.append(tok.string)
    return " ".join(out)


def name_pattern() -> re.Pattern[str]:
    words = set(algorithms.names()) | {"pof-mkl", "pof_mkl", "kofl", "fedbnr"}
    for n in algorithms.names():
        words.update(v.name for v in algorithms.get(n).replay_variants() if v.name not in ("local-only", "centralised"))
    alternatives = "|".join(sorted(map(re.escape, words), key=len, reverse=True))
    return re.compile(rf"(?<![a-z])(?:{alternatives})(?![a-z])", re.IGNORECASE)


@pytest.mark.parametrize("path", GENERIC, ids=lambda p: str(p.relative_to(ROOT)))
def test_generic_modules_name_no_algorithm(path: Path) -> None:
    hits = sorted(set(m.group(0) for m in name_pattern().finditer(code_without_docs(path))))
    assert not hits, f"{path.relative_to(ROOT)} names {hits}: go through streamfed.algorithms instead"


def test_the_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('"""A docstring may say pofmkl."""\n# so may a comment: fedbnr\n'
                   'if cfg.algorithm == "pofmkl":\n    pass\n')
    assert name_pattern().findall(code_without_docs(bad)) == ["pofmkl"]


def test_nothing_points_outside_the_repository() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    folder = "shared"  # the folder beside the repository the first documents lived in (not spelled whole here)
    outside = re.compile(rf"\.\./{folder}|{folder}/docs|{folder}/papers")
    hits = [f for f in files if f.endswith((".py", ".md", ".toml", ".sh", ".yml", ".yaml", ".txt", ".service"))
            and outside.search((ROOT / f).read_text(encoding="utf-8", errors="replace"))]
    assert not hits, f"these files point outside the repository: {hits}"


def _small_fleet(alg: algorithms.Algorithm) -> FleetConfig:
    """A small fleet of `alg`: a dictionary of two kernels for the families that learn over one."""
    dictionary = {"n_kernels": 2, "n_features": 4, "kernels": None}
    return FleetConfig(fleet="f", algorithm=alg.name, n_inputs=3,
                       params={k: v for k, v in dictionary.items() if k in alg.Params.model_fields})


@pytest.mark.parametrize("name", algorithms.names())
def test_every_registered_algorithm_fills_the_contract(name: str) -> None:
    alg = algorithms.get(name)
    assert alg.name == name and alg.title and issubclass(alg.Params, algorithms.base.Params)
    cfg = _small_fleet(alg)
    ps = cfg.protocol_schema
    for channel in (Channel.UPDATES, Channel.GLOBAL):
        assert len(ps.kinds_on(channel)) == 1, f"{name}: one kind on {channel}"
    learner = alg.learner(cfg, "a", 0, "lockstep" if alg.lockstep else "async")
    agg = alg.aggregation(cfg)
    assert isinstance(learner, Learner) and isinstance(agg, Aggregation)
    # partials: the sum kind first (the fleet's partial kind, what secure aggregation sums), then the kind a
    # lock-step round travels in when its global depends on the order of additions (`round_kind`), if any
    rounds = () if agg.round_kind is None else (agg.round_kind,)
    assert ps.kinds_on(Channel.PARTIALS) == (cfg.partial_kind, *rounds), f"{name}: its kinds on partials"
    assert agg.round_kind is None or alg.lockstep
    assert cfg.kernel_version == alg.kernel_version(cfg) and isinstance(cfg.kernel_version, str)


def test_the_core_runs_without_torch() -> None:
    """POF-MKL, RFF FedBNR and the agent/aggregator cores import and learn with torch unimportable (the
    test environment has torch, for the optional learners' oracles: here it is hidden)."""
    import subprocess
    import sys

    code = """
import sys
sys.modules["torch"] = None  # `import torch` now raises ImportError
import numpy as np
from streamfed import algorithms
from streamfed.algorithms.fedbnr.estimator import FedBNRRegressor
from streamfed.algorithms.pofmkl.estimator import POFMKLRegressor
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading
for m in (FedBNRRegressor(n_features=4), POFMKLRegressor(n_kernels=2, n_features=4)):
    for t in range(40):
        m.learn_one({"a": t / 40, "b": (t % 7) / 7}, float(np.sin(t)))
    assert np.isfinite(m.predict_one({"a": 0.5, "b": 0.1}))
for name in ("pofmkl", "fedbnr"):
    cfg = FleetConfig(fleet="f", algorithm=name, n_inputs=2, n_kernels=2, n_features=4)
    agent, agg = AgentCore(cfg, "a", 0), AggregatorCore(cfg, mode="async", window=0.0)
    for t in range(40):
        agent.on_reading(Reading(f"r{t}", np.array([t / 40, 0.5]), float(t), y=float(np.cos(t))))
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


TEMPLATE = ("__init__.py", "client.py", "server.py", "wire.py", "learner.py", "aggregation.py")
OLD_NAMES = ("agent.py", "fleet_halves.py", "regressor.py", "classifier.py", "bound.py", "bounds.py")


@pytest.mark.parametrize("family", sorted(p.parent.name for p in (ROOT / "streamfed/algorithms").glob("*/__init__.py")))
def test_every_family_follows_the_template(family: str) -> None:
    """docs/architecture.md, "Adding an algorithm": one module layout for every family, and the objects the
    registry hands out live where the template says (the learner in `learner.py`, ...)."""
    folder = ROOT / "streamfed/algorithms" / family
    files = {p.name for p in folder.glob("*.py")}
    assert not (missing := [f for f in TEMPLATE if f not in files]), f"{family} lacks {missing}"
    assert not (old := sorted(files & set(OLD_NAMES))), f"{family} keeps pre-template modules {old}"
    package = f"streamfed.algorithms.{family}"
    checked = []
    for name in algorithms.names():
        alg = algorithms.get(name)
        if type(alg).__module__ != package:
            continue
        checked.append(name)
        cfg = _small_fleet(alg)
        learner = alg.learner(cfg, "a", 0, "lockstep" if alg.lockstep else "async")
        if isinstance(learner, CalibratedLearner):  # the shared variance calibration around the family's own
            learner = learner.inner
        assert type(learner).__module__ == f"{package}.learner", (name, type(learner).__module__)
        assert type(alg.aggregation(cfg)).__module__ == f"{package}.aggregation", name
        try:
            est = alg.estimator()
        except NotImplementedError:  # a family without a River estimator (the paper's baselines)
            continue
        cls = est if isinstance(est, type) else type(est)
        assert cls.__module__.endswith(".estimator"), (name, cls.__module__)  # its own, or a family it extends
    assert checked, f"no registered algorithm is defined in {package}"
