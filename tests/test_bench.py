"""`streamfed.evaluation.bench`: a quick benchmark end to end in a temporary directory (real scripts, real numbers)."""

import json
import math

from streamfed.evaluation.bench import BENCHES, assemble, check_numbers, run_bench


def _numbers(tree):
    if isinstance(tree, bool) or tree is None or isinstance(tree, str):
        return
    if isinstance(tree, int | float):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _numbers(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from _numbers(v)


def test_quick_messages_bench_writes_sane_json_and_markdown(tmp_path):
    assert run_bench(["messages"], tmp_path, quick=True) == 0
    data = json.loads((tmp_path / "messages.json").read_text())
    assert data["meta"]["quick"] is True
    rows = data["rows"]
    assert len(rows) >= 3
    for r in rows:
        for key in ("encode_us", "packb_us", "decode_us", "unpackb_us", "decode_MBps", "bytes"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["case"], key, r[key])
        # validation does more than plain unpacking: the decode must not be faster than msgpack alone
        assert r["decode_ratio"] > 1.0, r
    assert check_numbers(data) == []
    assert all(math.isfinite(x) for x in _numbers({k: v for k, v in data.items() if k != "meta"}))
    section = (tmp_path / "messages.md").read_text()
    assert section.startswith("## Wire messages") and "| pofmkl M=1 D=50 |" in section
    doc = (tmp_path / "benchmarks.md").read_text()  # assembled beside the results, not into docs/
    # an index: the section's title and what it measures, and a link to its figures (kept in one place)
    assert doc.startswith("# Benchmarks") and "## Wire messages" in doc and "messages.md)" in doc
    assert "| pofmkl M=1 D=50 |" not in doc


def test_unknown_bench_is_refused_and_nan_is_caught(tmp_path):
    assert run_bench(["no-such-bench"], tmp_path) == 2
    assert not any(tmp_path.iterdir())
    assert check_numbers({"a": [1.0, float("nan")], "b": {"c": float("inf")}}) == ["a[1]", "b.c"]
    assert "fleet" in BENCHES and "messages" in BENCHES


def test_assemble_orders_registered_sections_first(tmp_path):
    (tmp_path / "zzz.md").write_text("## extra\n")
    (tmp_path / "flops.md").write_text("## flops\n")
    (tmp_path / "messages.md").write_text("## messages\n")
    text = assemble(tmp_path, tmp_path / "out.md").read_text()
    assert text.index("## messages") < text.index("## flops") < text.index("## extra")


def test_cli_bench_runs_a_quick_bench_and_refuses_unknown_names(tmp_path):
    from typer.testing import CliRunner

    from streamfed.cli import app

    res = CliRunner().invoke(app, ["bench", "messages", "--quick", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "messages.json").read_text())["meta"]["quick"] is True
    assert (tmp_path / "benchmarks.md").read_text().startswith("# Benchmarks")
    bad = CliRunner().invoke(app, ["bench", "no-such-bench", "--out", str(tmp_path / "x")])
    assert bad.exit_code != 0 and "no-such-bench" in bad.output
    assert not (tmp_path / "x").exists()
