"""`streamfed.loadtest`, small: 20 real agent services in one process, the `streamfed aggregator` command
and a real Mosquitto; every published update must be in the last global, none rejected."""

import math

from streamfed.loadtest import LoadTestOptions, run_loadtest


def test_small_load_test_loses_and_rejects_nothing(mosquitto_dev):
    opts = LoadTestOptions(agents=20, seconds=5.0, rate=2.0, window=0.5, drain=20.0, ramp=1.0)
    r = run_loadtest(opts, broker=mosquitto_dev.broker_config())
    assert r["agents"] == 20
    assert r["samples_learned"] == r["samples_expected"] == 200
    assert r["updates_published"] == 200  # async POF-MKL: one update per sample
    assert r["updates_lost"] == 0 and r["clients_with_lost"] == 0, r
    assert r["updates_rejected"] == {}, r["updates_rejected"]
    assert r["updates_accepted"] == r["updates_published"] and r["resent"] == 0
    assert r["outbox_left"] == 0
    assert r["included_beyond_published"] == 0
    assert r["lag_s"]["n"] == 200 and 0 < r["lag_s"]["p50"] < 10 and math.isfinite(r["lag_s"]["max"])
    assert r["aggregator"]["hwm_bytes"] > 0
