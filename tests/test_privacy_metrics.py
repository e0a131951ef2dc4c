"""Under differential privacy an agent's metrics endpoint publishes no statistic of its raw stream
(docs/privacy.md § The privacy boundary): scraped through prometheus_client's own registry and parser, the
quality families are absent under DP, present without it and with the operator's explicit opt-in, and the whole
scrape of two neighbouring streams is the same text under DP."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from streamfed.fleet.agent import AgentCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading
from streamfed.runtime.exporter import StreamfedCollector, make_registry

PUBLIC = {"x_mean": [1000.0], "x_scale": [10.0], "y_mean": 40.0, "y_scale": 5.0}
# every family computed from the raw samples (their values, their number, their timing)
DATA_FAMILIES = {
    "streamfed_agent_samples", "streamfed_agent_samples_skipped", "streamfed_agent_learner_steps",
    "streamfed_agent_cumulative_loss", "streamfed_agent_best_kernel_cumulative_loss", "streamfed_agent_regret",
    "streamfed_agent_mse", "streamfed_agent_windowed_mse", "streamfed_agent_interval_hits",
    "streamfed_agent_interval_predictions", "streamfed_agent_interval_coverage_ratio",
    "streamfed_agent_kernel_weight", "streamfed_agent_prediction_duration_seconds",
    "streamfed_prediction_duration_seconds",
}


def config(algorithm: str, dp: bool) -> FleetConfig:
    kw: dict = dict(fleet="m", n_inputs=1, n_features=4, public_scales=PUBLIC, dp_epsilon=1.0 if dp else None)
    if algorithm == "pofmkl":
        kw.update(algorithm="pofmkl", n_kernels=2, bin_size=2, dp_window=8)
    else:
        kw.update(algorithm="fedbnr", kernels=["gaussian:1.0", "gaussian:3.0"], params={"min_upload": 8})
    return FleetConfig(**kw)


def stream(with_target: bool, n: int = 40) -> list[Reading]:
    out = []
    for t in range(n):
        x, y = 1000.0 + 10.0 * math.sin(1.3 * t), 40.0 + 5.0 * math.cos(0.7 * t)
        if t == 5:  # the neighbouring stream: this arrival's sample is absent (its label is not a number)
            x, y = (1100.0, 100.0) if with_target else (1000.0, float("nan"))
        out.append(Reading(f"r{t}", np.array([x]), float(t), y=y))
    return out


def scrape(algorithm: str, dp: bool, with_target: bool = True, opt_in: bool = False) -> str:
    agent = AgentCore(config(algorithm, dp), "a1", 0, mode="async")
    agent.stats.unnoised_metrics = opt_in
    if agent.privacy is not None:
        agent.privacy.rng = np.random.default_rng(7)  # the same noise draws on both streams
    for r in stream(with_target):
        agent.on_reading(r)
    agent.stats.update_from_learner(agent.learner)  # the regret and learner values too (per upload otherwise)
    return generate_latest(make_registry(StreamfedCollector([agent.stats]))).decode()


def families(text: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(fam.name, {})[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.parametrize("algorithm", ["fedbnr", "pofmkl"])
def test_quality_metrics_are_withheld_under_dp_and_published_without(algorithm: str) -> None:
    plain, private = families(scrape(algorithm, dp=False)), families(scrape(algorithm, dp=True))
    intervals = {"streamfed_agent_interval_hits", "streamfed_agent_interval_predictions",
                 "streamfed_agent_interval_coverage_ratio"}
    assert DATA_FAMILIES - (intervals if algorithm == "pofmkl" else set()) <= set(plain)  # POF-MKL has no variance
    assert not DATA_FAMILIES & set(private), sorted(DATA_FAMILIES & set(private))
    # what is left is public or the accountant's: uploads, health, versions, (ε, δ), and the upload count
    assert private["streamfed_agent_dp_epsilon"] and private["streamfed_agent_upload_messages"]
    values = {dict(k[1])["name"] for k in private.get("streamfed_agent_learner_value", {})}
    assert values == {"dp_epsilon", "dp_uploads"}
    assert "labels_clipped" in {dict(k[1])["name"] for k in plain["streamfed_agent_learner_value"]}


def test_the_operator_may_opt_in_to_unnoised_metrics() -> None:
    opted = families(scrape("fedbnr", dp=True, opt_in=True))
    assert DATA_FAMILIES <= set(opted)
    assert "streamfed_agent_dp_epsilon" in opted


@pytest.mark.parametrize("algorithm", ["fedbnr", "pofmkl"])
def test_neighbouring_streams_scrape_the_same_under_dp(algorithm: str) -> None:
    """One sample added or removed changes nothing the endpoint says under DP (the noise draws are the same, and
    the scrape holds none of them); without DP, or opted in, it does."""
    assert scrape(algorithm, dp=True, with_target=True) == scrape(algorithm, dp=True, with_target=False)
    assert scrape(algorithm, dp=False, with_target=True) != scrape(algorithm, dp=False, with_target=False)
    assert (scrape(algorithm, dp=True, with_target=True, opt_in=True)
            != scrape(algorithm, dp=True, with_target=False, opt_in=True))


# ---------------------------------------------------------------- streamfed replay --dp-epsilon (issue 31)
@pytest.mark.slow  # a replay through the CLI: over 2 s with its imports
def test_replay_under_dp_refuses_what_would_break_the_agents_boundary_in_one_line(tmp_path) -> None:  # noqa: ANN001
    """A dataset without declared scales, or a normalisation by the data's own statistics, would report a guarantee
    the agent does not give: one `error:` line, exit 2. Beijing runs on the agent's boundary, and the report's
    command says --dp-epsilon (it did not before)."""
    from typer.testing import CliRunner

    from streamfed.cli import app

    for extra in (["--dataset", "synthetic"], ["--dataset", "beijing-air", "--normalisation", "paper"]):
        res = CliRunner().invoke(app, ["replay", *extra, "--dp-epsilon", "1", "-a", "fedbnr", "--steps", "40",
                                       "--out", str(tmp_path)])
        assert res.exit_code == 2, res.output
        assert res.output.startswith("error: --dp-epsilon") and len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(app, ["replay", "--dataset", "beijing-air", "--dp-epsilon", "4", "-a", "fedbnr",
                                   "--steps", "64", "--n-features", "5", "--out", str(tmp_path), "--no-plots"])
    assert res.exit_code == 0, res.output
    report = (tmp_path / "results.md").read_text()
    assert "--dp-epsilon 4.0" in report and "--normalisation none" in report
