"""`kt bench` on a tiny layer: the measurements are made and reported as ratios to peaks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import ktforge
from ktforge.cli import bench
from ktforge.cli import commands as cli

TINY = bench.Model("tiny", hidden=96, intermediate=80, experts=16, top_k=4)


def test_models_are_the_real_shapes() -> None:
    models = bench.models()
    assert (models["qwen3-30b-a3b"].hidden, models["qwen3-30b-a3b"].intermediate) == (2048, 768)
    assert (models["deepseek-v3"].experts, models["deepseek-v3"].top_k) == (256, 8)
    assert (models["mixtral-8x7b"].intermediate, models["mixtral-8x7b"].top_k) == (14336, 2)


def test_deepseek_is_cut_to_what_memory_allows() -> None:
    ds = bench.models()["deepseek-v3"]
    per_expert = 3 * ds.hidden * ds.intermediate * 4
    assert bench.experts_that_fit(ds, 10 * per_expert) == 10
    assert bench.experts_that_fit(ds, 10**15) == 256
    assert bench.experts_that_fit(ds, 0) == 1


@pytest.mark.parametrize("kind", ["uniform", "zipf"])
def test_routing_draws_distinct_experts(kind: str) -> None:
    ids, weights = bench.routing(kind, 200, 32, 4, np.random.default_rng(0))
    assert ids.shape == (200, 4) and ids.min() >= 0 and ids.max() < 32
    assert all(len(set(row)) == 4 for row in ids.tolist())
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-5)
    counts = np.bincount(ids.ravel(), minlength=32)
    if kind == "zipf":
        assert counts.max() > 3 * np.median(counts)  # a few hot experts
    else:
        assert counts.max() < 3 * np.median(counts)


def test_cli_bench_json_on_a_tiny_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "models", lambda: {"tiny": TINY})
    result = CliRunner().invoke(
        cli.app, ["bench", "--model", "tiny", "--tokens", "1,64", "--method", "bf16,int4", "--repeats", "1", "--json"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    [peaks] = document["peaks"].values()  # the best backend this machine runs
    assert peaks["bf16_dot"] > 0 and peaks["int8_dot"] > 0 and peaks["read_gb_per_s"] > 0
    results = document["results"]
    assert len(results) == 2 * 2 * 2  # methods x token counts x routings
    for r in results:
        assert r["ms"] > 0 and r["tokens_per_s"] > 0 and r["pct_of_peak"] > 0
        assert r["peak_kind"] == ("read_gb_per_s" if r["tokens"] == 1 else bench.PEAK_KIND[r["method"]])
        assert r["speedup_vs_torch"] > 0  # torch is a test requirement: the peer ran
        assert set(r["profile_ms"]) >= {"gate_up_ms", "down_ms"}


def test_cli_bench_rejects_unknown_models() -> None:
    result = CliRunner().invoke(cli.app, ["bench", "--model", "gpt-5"])
    assert result.exit_code == 2 and "unknown model" in result.stderr


def test_cli_bench_names_a_backend_this_machine_cannot_run_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "models", lambda: {"tiny": TINY})
    monkeypatch.delenv("KTFORGE_BLIS_LIBRARY", raising=False)
    compiled = {b["name"] for b in ktforge.build_info()["backends"]}
    # amd-blis without a linked library, or the AMX tiles in a build without them
    backend = "amx" if "amx" not in compiled else "amd-blis"
    args = ["bench", "--model", "tiny", "--tokens", "1", "--method", "int8", "--repeats", "1", "--no-peer"]
    result = CliRunner().invoke(cli.app, [*args, "--backend", backend])
    if backend == "amd-blis" and ktforge.build_info()["blis"]:  # an amd-blis build here: it runs
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 2
    assert result.stderr.startswith("kt bench: ") and "Traceback" not in result.output
    assert "not compiled into this build" in result.stderr or "kt build --backend amd-blis" in result.stderr
