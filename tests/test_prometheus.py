"""The shipped Prometheus/Grafana configuration, checked with `promtool` and a real Prometheus.

A real Prometheus scrapes two endpoints served by this process — the agents (POF-MKL clients and a
FedBNR client stepping on synthetic data, found by file-based discovery) and their aggregator (a
static target) — and evaluates the shipped rules; the tests then compare its answers with the stats
objects, and run every query of the Grafana dashboard. A missing `prometheus`/`promtool` is a
failure (`bash scripts/setup.sh` installs them), never a skip.
"""

from __future__ import annotations

import doctest
import json
import math
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pytest

from streamfed.algorithms.fedbnr.client import FedBNRClient
from streamfed.algorithms.fedbnr.learner import StatsLearner
from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.learner import POFMKLLearner
from streamfed.algorithms.pofmkl.server import POFMKLServer
from streamfed.core.features import RFFBank, gaussian_dictionary
from streamfed.evaluation.datasets.synthetic import synthetic_fleet
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading
from streamfed.fleet.telemetry import AgentStats, AggregatorStats
from streamfed.runtime.exporter import MetricsServer, StreamfedCollector, make_registry, serve_metrics
from tests import prometheus as prom

BROKER_CONFIG = prom.REPO / "broker_config"
RULES = prom.PROMETHEUS_CONFIG / "rules" / "streamfed.rules.yml"
DASHBOARD = BROKER_CONFIG / "grafana" / "dashboards" / "streamfed.json"
AGENTS_JOB, AGGREGATOR_JOB = "streamfed-agents", "streamfed-aggregator"  # as in prometheus.yml and the rules
FLEET = "demo"
PER_AGENT = re.compile(r"(?<!fleet:)streamfed_agent_")
GRAFANA_INTERVALS = {"$__rate_interval": "1m", "$__interval": "1s", "$__range": "1m"}


@pytest.fixture(scope="module")
def tools() -> None:
    """`prometheus` and `promtool` are installed — else every test using them fails, saying how to fix it."""
    prom.require(lambda msg: pytest.fail(msg, pytrace=False))


def test_helper_doctests() -> None:
    result = doctest.testmod(prom, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 4 and result.failed == 0


# --------------------------------------------------------------------------- promtool on the shipped files


def check(res: Any) -> str:
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    return out


def test_promtool_check_config(tools: None) -> None:
    out = check(prom.promtool("check", "config", str(prom.PROMETHEUS_CONFIG / "prometheus.yml")))
    assert "2 rule files found" in out and "WARNING" not in out, out  # streamfed.rules.yml, mosquitto.rules.yml


def test_promtool_check_rules(tools: None) -> None:
    out = check(prom.promtool("check", "rules", str(RULES)))
    assert "10 rules found" in out


def test_promtool_test_rules(tools: None) -> None:
    check(prom.promtool("test", "rules", str(prom.PROMETHEUS_CONFIG / "tests" / "streamfed.rules.test.yml")))


def test_promtool_check_metrics_on_real_exposition(tools: None) -> None:
    fleet = Fleet.build()
    fleet.run_rounds(60)
    big = StreamfedCollector([AgentStats(f"a{i}", fleet="big") for i in range(60)])  # no per-client histograms
    for collector in (fleet.agent_collector, fleet.aggregator_collector, big):
        server, port = serve_metrics(make_registry(collector))
        with server, urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read()
        assert body.count(b"\n") > 20
        out = check(prom.promtool("check", "metrics", stdin=body))
        assert out.strip() == "", out  # promtool prints nothing when the exposition is clean


# --------------------------------------------------------------------------- the Grafana dashboard


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])  # collapsed rows keep their panels inside


def query_panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in panels(d) if p["type"] != "row"]


def test_dashboard_structure() -> None:
    d = dashboard()
    for key in ("uid", "title", "panels", "templating", "schemaVersion", "time", "refresh"):
        assert key in d, key
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert {"datasource", "fleet", "client"} <= set(variables)
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    client = variables["client"]
    assert client["type"] == "query" and client["multi"] and client["includeAll"]
    assert "label_values(" in client["query"] and ", client)" in client["query"]
    assert client["datasource"]["uid"] == "${datasource}"
    qp = query_panels(d)
    assert len(qp) >= 15
    for p in qp:
        where = f"panel {p['id']} {p.get('title')!r}"
        assert p.get("title") and p.get("description"), where
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        g = p["gridPos"]
        assert {"h", "w", "x", "y"} <= set(g) and g["x"] + g["w"] <= 24, where
        assert p["targets"], where
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), where
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"], where
            assert isinstance(t.get("expr"), str) and t["expr"].strip(), where
            assert t["expr"].count("(") == t["expr"].count(")") and t["expr"].count("{") == t["expr"].count("}")
    # the panels the brief asks for, by the metric they show
    exprs = " ".join(t["expr"] for p in qp for t in p["targets"])
    for needed in ("streamfed_agent_regret{", "client:streamfed_agent_regret_per_sample:ratio",
                   "fleet:streamfed_agent_regret_per_sample:ratio", "streamfed_agent_best_kernel_cumulative_loss",
                   "streamfed_agent_windowed_mse", "streamfed_agent_interval_coverage_ratio",
                   "streamfed_agent_kernel_weight", "streamfed_agent_upload_bytes_total",
                   "streamfed_agent_upload_messages_total", "histogram_quantile(",
                   "streamfed_aggregator_updates_rejected_total", "streamfed_aggregator_active_clients",
                   "streamfed_aggregator_rounds_total", "streamfed_aggregator_global_version",
                   "streamfed_agent_accuracy", "streamfed_agent_log_loss",
                   "streamfed_agent_expected_calibration_error"):
        assert needed in exprs, needed
    # every per-agent query filters on the client variable (fleet-level recording rules have no client)
    for p in qp:
        for t in p["targets"]:
            if PER_AGENT.search(t["expr"]):
                assert 'client=~"$client"' in t["expr"], (p["title"], t["expr"])


def test_provisioning_and_compose_agree_with_the_files() -> None:
    compose = (BROKER_CONFIG / "compose.yml").read_text()
    mounts = re.findall(r"^\s*- (\./[^:\s]+):([^:\s]+)", compose, re.M)
    assert len(mounts) == 4
    for host, _ in mounts:
        assert (BROKER_CONFIG / host).exists(), f"compose.yml mounts missing {host}"
    assert ("./mosquitto/dev.conf", "/etc/streamfed/mosquitto.conf") in mounts
    assert "mosquitto -c /etc/streamfed/mosquitto.conf" in compose
    dash_target = dict(mounts)["./grafana/dashboards"]
    provider = (BROKER_CONFIG / "grafana" / "provisioning" / "dashboards" / "streamfed.yml").read_text()
    assert f"path: {dash_target}" in provider
    assert f"{dash_target}/streamfed.json" in compose  # the home dashboard
    datasource = (BROKER_CONFIG / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert f"uid: {variables['datasource']['current']['value']}" in datasource
    assert "--web.listen-address=127.0.0.1:9090" in compose and "url: http://127.0.0.1:9090" in datasource


# --------------------------------------------------------------------------- a live fleet and a real Prometheus


@dataclass
class Fleet:
    """Three POF-MKL agents and a FedBNR agent in lock-step rounds, with their aggregator; stats fed as
    the runtime feeds them (uploads, globals, a rejection or skip now and then). A pFedGP agent (a whole
    AgentCore, its stats fed by the core itself) classifies the FedBNR client's inputs into three bands of
    its target: the dashboard's classifier panels are checked on a real classifier's numbers, the other
    panels on the regressors' as before."""

    data: Any
    clients: list[POFMKLClient]
    server: POFMKLServer
    bayes: FedBNRClient
    agents: list[AgentStats]
    aggregator: AggregatorStats
    agent_collector: StreamfedCollector
    aggregator_collector: StreamfedCollector
    classifier: AgentCore
    personal: AgentCore
    t: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(cls, n_steps: int = 20_000) -> Fleet:
        data = synthetic_fleet(4, n_steps, 2, seed=11)
        bank = RFFBank(gaussian_dictionary(5), n_features=16, n_inputs=2, seed=11)
        clients = [POFMKLClient(bank, eta=0.05, xi=0.2, bin_size=2, rng=c) for c in range(3)]
        bayes = FedBNRClient(n_inputs=2, n_features=12, bandwidth=[0.5, 1.0, 2.0], sigma=0.3, min_upload=16,
                             client_id="bayes-0")
        agents = [AgentStats.from_learner(POFMKLLearner(cl, "lockstep"), data.names[c], fleet=FLEET,
                                          algorithm="pofmkl") for c, cl in enumerate(clients)]
        agents.append(AgentStats.from_learner(StatsLearner(bayes), "bayes-0", fleet=FLEET, algorithm="fedbnr"))
        cfg = FleetConfig(fleet=FLEET, algorithm="pfedgp", n_inputs=2, params={
            "n_classes": 3, "learn_kernel": False, "budget": 8, "chains": 2, "burn_in": 2})
        classifier = AgentCore(cfg, "classifier-0", 4, stats=AgentStats("classifier-0", fleet=FLEET,
                                                                         algorithm="pfedgp"))
        agents.append(classifier.stats)
        # a personalised FedBNR agent on the FedBNR client's stream: its experts' mixture weights (no fleet here)
        cfg = FleetConfig(fleet=FLEET, algorithm="fedbnr-personal", n_inputs=2, n_features=6,
                          params={"min_upload": 16})
        personal = AgentCore(cfg, "personal-0", 5, stats=AgentStats("personal-0", fleet=FLEET,
                                                                     algorithm="fedbnr-personal"))
        agents.append(personal.stats)
        aggregator = AggregatorStats(FLEET)
        return cls(data, clients, POFMKLServer(bank.n_kernels, bank.dim), bayes, agents, aggregator,
                   StreamfedCollector(agents), StreamfedCollector([], [aggregator]), classifier, personal)

    def run_rounds(self, n: int) -> None:
        with self.lock:
            for _ in range(n):
                self._round()

    def _round(self) -> None:
        t = self.t % len(self.data[0])
        for c, (cl, stats) in enumerate(zip(self.clients, self.agents, strict=False)):
            x, y = self.data[c].X[t], float(self.data[c].y[t])
            t0 = time.perf_counter()
            yhat, upd = cl.step(x, y)
            stats.observe_prediction(y, yhat, time.perf_counter() - t0)
            stats.uploaded(upd.delta.nbytes + upd.kernels.nbytes + 64)
            self.server.add(upd)
            self.aggregator.accepted(stats.client)
        t0 = time.perf_counter()
        version = self.server.finish_round()
        g = self.server.global_params()
        self.aggregator.round_completed(version, time.perf_counter() - t0)
        for cl, stats in zip(self.clients, self.agents, strict=False):
            cl.set_global(g, version)
            stats.global_received(version)
            stats.update_from_learner(POFMKLLearner(cl, "lockstep"))
        b, bstats = self.bayes, self.agents[3]
        x, y = self.data[3].X[t], float(self.data[3].y[t])
        t0 = time.perf_counter()
        mu, var = b.predict(x)
        bstats.observe_prediction(y, mu, time.perf_counter() - t0, var)
        b.learn(x, y)
        up = b.make_upload()
        if up is not None:
            bstats.uploaded(sum(v.nbytes for v in up.to_message().values() if isinstance(v, np.ndarray)) + 64)
            bstats.update_from_learner(StatsLearner(b))
        band = float(np.searchsorted(self.bands, y))  # the class: which third of the target's range
        self.classifier.on_reading(Reading(f"r{self.t}", x, float(self.t), band))
        self.personal.on_reading(Reading(f"r{self.t}", x, float(self.t), y))
        if self.t % 40 == 7:
            self.aggregator.rejected("stale_seq")
        if self.t % 90 == 13:
            self.agents[self.t % 3].skip("malformed")
        self.t += 1

    def finish(self) -> None:
        """Bring every learner-side value up to date (the runtime would do this per upload)."""
        with self.lock:
            for cl, stats in zip(self.clients, self.agents, strict=False):
                stats.update_from_learner(POFMKLLearner(cl, "lockstep"))
            self.agents[3].update_from_learner(StatsLearner(self.bayes))
            self.classifier.stats.update_from_learner(self.classifier.learner)
            self.personal.stats.update_from_learner(self.personal.learner)

    @cached_property
    def bands(self) -> np.ndarray:
        """Tertiles of the FedBNR client's target: the classifier's three classes."""
        return np.quantile(self.data[3].y, [1 / 3, 2 / 3])


@dataclass
class Live:
    fleet: Fleet
    prometheus: prom.Prometheus
    servers: list[MetricsServer]
    stopped_at: float


@pytest.fixture(scope="module")
def live(tools: None) -> Iterator[Live]:
    fleet = Fleet.build()
    fleet.run_rounds(50)
    agents_srv, agents_port = serve_metrics(make_registry(fleet.agent_collector))
    agg_srv, agg_port = serve_metrics(make_registry(fleet.aggregator_collector))
    servers = [agents_srv, agg_srv]
    stop = threading.Event()

    def feed() -> None:  # the runtime's hot path, while Prometheus scrapes
        while not stop.is_set():
            fleet.run_rounds(5)
            time.sleep(0.01)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    # agents by file-based discovery (as prometheus.yml allows), the aggregator as a static target
    config = prom.scrape_config({AGGREGATOR_JOB: [f"127.0.0.1:{agg_port}"]}, rule_files=[RULES],
                                file_sd={AGENTS_JOB: "agents-test.yml"})
    targets = json.dumps([{"targets": [f"127.0.0.1:{agents_port}"], "labels": {"site": "test"}}])
    p = None
    try:
        p = prom.start_prometheus(config, files={"agents-test.yml": targets})
        # enough scrapes for rate() windows and rule evaluations on both jobs
        p.wait_for(lambda: all(v >= 4 for v in p.values("count_over_time(up[1m])").values())
                   and len(p.values("up")) == 2, timeout=30, what="4 scrapes of both targets")
        p.wait_for_series("client:streamfed_agent_regret_per_sample:ratio")
        p.wait_for_series("fleet:streamfed_agent_regret_per_sample:ratio")
        stop.set()
        feeder.join()
        fleet.finish()
        stopped_at = time.time()
        # a scrape of each target after the last update (then every scrape reads the final values) ...
        scraped = p.wait_for(lambda: (ts := p.values("timestamp(up)").values()) and min(ts) > stopped_at + 0.05
                             and max(ts), timeout=15, what="a scrape of both targets after the fleet stopped")
        # ... and a rule evaluation after that scrape was stored (a scrape is stamped when it starts)
        p.wait_for(lambda: min(p.values("timestamp(client:streamfed_agent_regret_per_sample:ratio)").values())
                   > scraped + 0.3, timeout=15, what="a rule evaluation after that scrape")
        yield Live(fleet, p, servers, stopped_at)
    finally:
        stop.set()
        if p is not None:
            p.close()
        for s in servers:
            s.close()


def test_targets_are_up_and_rules_healthy(live: Live) -> None:
    p = live.prometheus
    up = {dict(k)["job"]: v for k, v in p.values("up").items()}
    assert up == {AGENTS_JOB: 1.0, AGGREGATOR_JOB: 1.0}
    assert p.values(f'streamfed_agent_info{{job="{AGENTS_JOB}", site="test"}}')  # file_sd labels applied
    groups = p.get("/api/v1/rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == 10
    bad = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    # a healthy, fed fleet raises none of the alerts
    firing = [a for a in p.get("/api/v1/alerts")["alerts"] if a["state"] == "firing"]
    assert not firing, firing


def test_regret_query_returns_the_stats_value_exactly(live: Live) -> None:
    p = live.prometheus
    assert live.fleet.t > 200
    for stats, cl in zip(live.fleet.agents, live.fleet.clients, strict=False):
        assert stats.regret == cl.regret != 0.0  # the stats hold the learner's R(T)...
        got = p.value(f'streamfed_agent_regret{{fleet="{FLEET}", client="{stats.client}"}}')
        assert got == stats.regret, (stats.client, got, stats.regret)  # ...and Prometheus returns it bit for bit
        steps = p.value(f'streamfed_agent_learner_steps_total{{client="{stats.client}"}}')
        assert steps == cl.n_steps == live.fleet.t
        assert p.value(f'streamfed_agent_cumulative_loss{{client="{stats.client}"}}') == cl.cumulative_loss
        assert p.value(f'streamfed_agent_windowed_mse{{client="{stats.client}"}}') == stats.windowed_mse
        kernels = p.values(f'streamfed_agent_kernel_weight{{client="{stats.client}"}}')
        assert {dict(k)["kernel"]: v for k, v in kernels.items()} == dict(
            zip(cl.bank.kernel_names, cl.kernel_weights.tolist(), strict=True))
    bayes = live.fleet.agents[3]
    assert p.value('streamfed_agent_regret{client="bayes-0"}') == bayes.regret
    assert p.value('streamfed_agent_interval_coverage_ratio{client="bayes-0"}') == bayes.coverage
    scores = live.fleet.classifier.stats.classification
    assert scores is not None and scores.n == live.fleet.t
    assert p.value('streamfed_agent_accuracy{client="classifier-0"}') == scores.accuracy
    assert p.value('streamfed_agent_log_loss{client="classifier-0"}') == scores.log_loss
    assert p.value('streamfed_agent_expected_calibration_error{client="classifier-0"}') == (
        scores.expected_calibration_error)
    for name in ("accuracy", "log_loss", "expected_calibration_error"):  # classifiers only
        assert [dict(k)["client"] for k in p.values(f"streamfed_agent_{name}")] == ["classifier-0"]
    assert p.value(f'streamfed_aggregator_rounds_total{{fleet="{FLEET}"}}') == live.fleet.aggregator.rounds


def test_recording_rules_values(live: Live) -> None:
    p = live.prometheus
    for stats in live.fleet.agents:
        got = p.value(f'client:streamfed_agent_regret_per_sample:ratio{{client="{stats.client}"}}')
        assert got == stats.regret / stats.learner_steps  # one IEEE division, here and there
    fleet_ratio = p.value(f'fleet:streamfed_agent_regret_per_sample:ratio{{fleet="{FLEET}"}}')
    expected = math.fsum(s.regret for s in live.fleet.agents) / sum(s.learner_steps for s in live.fleet.agents)
    assert fleet_ratio == pytest.approx(expected, rel=1e-12)


def substitute(expr: str, client: str) -> str:
    for var, value in GRAFANA_INTERVALS.items():
        expr = expr.replace(var, value)
    expr = expr.replace("$fleet", FLEET).replace("$client", client)
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


def test_every_dashboard_query_returns_data(live: Live) -> None:
    p = live.prometheus
    all_clients = "(" + "|".join(s.client for s in live.fleet.agents) + ")"  # Grafana's multi-value format
    end = time.time()
    problems = []
    for panel in query_panels(dashboard()):
        for target in panel["targets"]:
            expr = substitute(target["expr"], all_clients)
            try:  # a range query, as the panel issues it
                data = p.get("/api/v1/query_range", query=expr, start=f"{end - 20:.3f}", end=f"{end:.3f}", step="1")
            except prom.PrometheusError as e:
                problems.append(f"{panel['title']!r} {target['refId']}: invalid: {e}")
                continue
            finite = [v for s in data["result"] for _, v in s["values"] if math.isfinite(float(v))]
            if not finite:
                problems.append(f"{panel['title']!r} {target['refId']}: no data for {expr}")
    assert not problems, "\n".join(problems)


def test_every_dashboard_metric_exists(live: Live) -> None:
    names = set(live.prometheus.get("/api/v1/label/__name__/values"))
    used = {m for panel in query_panels(dashboard()) for t in panel["targets"]
            for m in re.findall(r"\b((?:client:|fleet:)?streamfed_[a-z0-9_:]+)", t["expr"])}
    assert used and not used - names, sorted(used - names)


def test_dashboard_variables_list_the_fleet_and_its_clients(live: Live) -> None:
    p = live.prometheus
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    pattern = re.compile(r"label_values\((.*), (\w+)\)")
    for name, expected in (("fleet", {FLEET}), ("client", {s.client for s in live.fleet.agents})):
        m = pattern.fullmatch(variables[name]["query"])
        assert m, variables[name]["query"]
        match = m.group(1).replace("$fleet", ".*")
        values = set(p.get(f"/api/v1/label/{m.group(2)}/values", **{"match[]": match}))
        assert values == expected, (name, values)


def test_single_client_selection(live: Live) -> None:
    """With one client selected, the per-client panels show that client only."""
    p = live.prometheus
    one = live.fleet.agents[0].client
    shown = 0
    for panel in query_panels(dashboard()):
        for target in panel["targets"]:
            if not PER_AGENT.search(target["expr"]):
                continue
            clients = {s["metric"].get("client") for s in p.query(substitute(target["expr"], one))}
            assert clients <= {one, None}, (panel["title"], clients)  # None: summed over clients
            shown += one in clients
    assert shown >= 12

