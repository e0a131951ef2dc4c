"""`streamfed demo` end to end: embedded Mosquitto, aggregator, agents, metrics endpoint, summary."""

import asyncio
import io
import subprocess
import urllib.request

import pytest
from rich.console import Console

from streamfed import demo as demo_mod
from streamfed.demo import DemoOptions, run_demo
from streamfed.runtime.broker import dev_config


def test_demo_runs_a_fleet_and_serves_metrics(monkeypatch, tmp_path):
    scraped = {}
    real_serve = demo_mod.serve_metrics

    def serve_and_remember(registry, host, port):  # scrape the endpoint while the fleet runs
        server, bound = real_serve(registry, host=host, port=port)
        scraped["url"] = server.url
        return server, bound

    monkeypatch.setattr(demo_mod, "serve_metrics", serve_and_remember)
    out = io.StringIO()
    console = Console(file=out, width=120)

    async def main():
        opts = DemoOptions(duration=4.0, agents=3, rate=100.0, out_dir=str(tmp_path))
        task = asyncio.create_task(run_demo(opts, console))
        # scrape while the fleet runs: after the learners are compiled (cold numba cache: seconds)
        while "url" not in scraped or "ready" not in out.getvalue():
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.0)
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(scraped["url"], timeout=5).read().decode())
        return await task, body

    summary, body = asyncio.run(main())
    text = out.getvalue()
    assert summary["broker"] == "mosquitto" and "Mosquitto" in text
    assert summary["agents"] == 3 and summary["samples"] > 300  # ~100 samples/s per agent for ~4 s
    assert summary["updates_accepted"] > 0
    # nothing refused but, possibly, agents' resends of updates the aggregator already applied (an agent
    # resends what the aggregator's start-up ack does not show as included; dropping the copy is the point)
    assert set(summary["rejected_by_reason"]) <= {"stale_seq"}, summary["rejected_by_reason"]
    assert summary["updates_rejected"] == sum(summary["rejected_by_reason"].values())
    assert summary["global_version"] > 0
    assert "summary" in text and "metrics" in text
    # the error in the stream's units (CO in µg/m³: hundreds, where the standardised MSE is about 1) next to the
    # standardised one, per agent and for the fleet, in the table, the printed summary and summary.json
    assert summary["stream_units"] == "µg/m³" and 50.0 < summary["fleet_rmse_stream"] < 5000.0, summary
    assert summary["fleet_mse_stream"] == pytest.approx(summary["fleet_rmse_stream"] ** 2)
    assert 0.0 < summary["fleet_mse"] < 10.0, summary
    assert set(summary["agents_rmse_stream"]) == set(summary["agents_mse"]) == {"Aotizhongxin", "Changping",
                                                                                "Dingling"}
    assert f"RMSE {summary['fleet_rmse_stream']:.1f} µg/m³" in text and "RMSE µg/m³" in text
    assert 'streamfed_agent_regret{client="Aotizhongxin",fleet="demo"}' in body
    assert "streamfed_aggregator_global_version" in body
    cmd = ["promtool", "check", "config", str(tmp_path / "prometheus.yml")]
    check = subprocess.run(cmd, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr  # the printed Prometheus command would work
    prom = (tmp_path / "prometheus.yml").read_text()
    assert scraped["url"].split("//")[1].split("/")[0] in prom and f"--config.file={tmp_path}" in text.replace("\n", "")


def test_dev_config_moves_the_listener_and_drops_persistence():
    conf = dev_config(12345)
    assert "listener 12345 127.0.0.1" in conf
    assert "persistence false" in conf and "persistence_location" not in conf
    assert "listener 1883" not in conf
