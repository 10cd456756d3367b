"""`kt bench` on a tiny layer: the measurements are made and reported as ratios to peaks."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import ktforge
from ktforge import bench
from ktforge.cli import commands as cli
from ktforge.detect.topology import read_live

from .. import host

TINY = bench.Model("tiny", hidden=96, intermediate=80, experts=16, top_k=4)


def test_models_are_the_real_shapes() -> None:
    models = bench.model.models()
    assert (models["qwen3-30b-a3b"].hidden, models["qwen3-30b-a3b"].intermediate) == (2048, 768)
    assert (models["deepseek-v3"].experts, models["deepseek-v3"].top_k) == (256, 8)
    assert (models["mixtral-8x7b"].intermediate, models["mixtral-8x7b"].top_k) == (14336, 2)


def test_deepseek_is_cut_to_what_memory_allows() -> None:
    ds = bench.model.models()["deepseek-v3"]
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


def test_zipf_routing_heats_other_experts_at_each_call() -> None:
    # one layer called again and again would keep fixed hot experts in the cache, unlike a model,
    # whose other layers run between two calls of one: each call ranks the experts anew
    rng = np.random.default_rng(0)
    hottest = {int(np.bincount(bench.routing("zipf", 64, 32, 4, rng)[0].ravel()).argmax()) for _ in range(8)}
    assert len(hottest) >= 4


def test_a_case_above_its_bound_is_called_a_wrong_bound_not_printed() -> None:
    from ktforge.cli.bench_text import share_of_bound

    assert share_of_bound(87.25) == " 87.2% of bound" and share_of_bound(87.25, short=True) == "87%"
    assert "%" not in share_of_bound(139.6) and "bound is wrong" in share_of_bound(139.6)
    assert share_of_bound(100.5, short=True) == "bound wrong"


def test_cli_bench_json_on_a_tiny_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.model, "models", lambda: {"tiny": TINY})
    args = ["--model", "tiny", "--tokens", "1,64", "--method", "bf16,int4", "--repeats", "1", "--threads", "1,2"]
    result = CliRunner().invoke(cli.app, ["bench", *args, "--group-size", "32", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["group_size"] == 32
    [by_threads] = document["peaks"].values()  # the best backend this machine runs
    assert set(by_threads) == {"1", "2"}
    for peaks in by_threads.values():
        assert min(peaks["bf16_dot"], peaks["int8_dot"], peaks["int4_dot"], peaks["read_gb_per_s"]) > 0
    assert "best of" in document["peak_method"]
    # a cell per NUMA node with usable CPUs and node with memory (one here: this machine's node)
    topology = read_live()
    cells = {(c["cpu_node"], c["memory_node"]): c for c in document["node_reads"]}
    memory = [n.id for n in topology.nodes if n.memory_bytes]
    assert set(cells) == {(n.id, m) for n in topology.usable_nodes() for m in memory}
    assert all(
        c["gb_per_s"] > 0 and c["threads"] == len(topology.node(c["cpu_node"]).usable_cpus) for c in cells.values()
    )
    [costs] = document["fixed_cost_us"].values()
    assert set(costs) == {"1", "2"} and all(us > 0 for us in costs.values())
    results = document["results"]
    assert len(results) == 2 * 2 * 2 * 2  # threads x methods x token counts x routings
    for r in results:
        assert r["ms_min"] <= r["ms"] <= r["ms_max"] and r["tokens_per_s"] > 0
        assert r["ms"] <= r["ms_p90"] <= r["ms_max"] and r["p90_over_median"] == pytest.approx(r["ms_p90"] / r["ms"])
        assert r["runs"] == (4 if r["tokens"] < bench.DECODE_MAX_TOKENS else 1)
        roof = r["roofline"]
        # the bound is the slower of the two ceilings, both the best peaks of the whole run (a
        # case measured before the machine showed its best is held to the same bound)
        peaks = document["peaks"][next(iter(document["peaks"]))][str(r["threads"])]
        assert roof["read_gb_per_s"] == peaks["read_gb_per_s"] > 0
        assert roof["dot_gops"] == peaks[roof["dot_peak"]] > 0
        assert roof["dot_peak"] == bench.DOT_PEAK[r["method"]]
        assert roof["compute_ms"] == pytest.approx(roof["ops"] / roof["dot_gops"] / 1e6)
        # a tiny layer's weights stay in the last-level cache (where sysfs names one): held to the
        # compute peak alone, a read-bandwidth bound would not be one
        assert roof["in_cache"] is (bench.bounds.llc_bytes() > 0)  # 16 experts of 96 x 80: under 1 MiB
        read_ms = roof["weight_bytes"] / roof["read_gb_per_s"] / 1e6
        assert roof["bandwidth_ms"] == pytest.approx(0.0 if roof["in_cache"] else read_ms)
        assert roof["bound_ms"] == max(roof["compute_ms"], roof["bandwidth_ms"])
        assert r["pct_of_bound"] == pytest.approx(100 * roof["bound_ms"] / r["ms"])
        assert roof["ops"] == 2 * r["tokens"] * TINY.top_k * 3 * TINY.hidden * TINY.intermediate
        # the bytes of the experts the routing touched, scales included (int4 packs below 1 byte)
        per_expert = roof["weight_bytes"] / r["experts_touched"]
        weights = 3 * TINY.hidden * TINY.intermediate
        assert (2 * weights <= per_expert < 2.2 * weights) if r["method"] == "bf16" else (weights / 2 < per_expert)
        assert 1 <= r["experts_touched"] <= min(TINY.experts, r["tokens"] * TINY.top_k)
        assert r["speedup_vs_torch"] > 0  # torch is a test requirement: the peer ran
        assert set(r["profile_ms"]) >= {"gate_up_ms", "down_ms"}
    [scale] = [s for s in document["scaling"] if (s["method"], s["tokens"], s["routing"]) == ("bf16", 64, "uniform")]
    assert scale["threads"] == [1, 2] and scale["speedup"] > 0


def test_default_tokens_are_the_help_s() -> None:
    help_text = " ".join(CliRunner().invoke(cli.app, ["bench", "--help"], env={"COLUMNS": "200"}).stdout.split())
    assert f"(default: {','.join(map(str, bench.DEFAULT_TOKENS))})" in help_text
    assert bench.DEFAULT_TOKENS == (1, 4, 16, 64, 128, 512, 2048)


def test_roofline_takes_the_slower_ceiling() -> None:
    peaks = bench.Peaks(fp32_fma=100.0, bf16_dot=0.0, int8_dot=400.0, int4_dot=500.0, read_gb_per_s=50.0)
    # 1 GOP of int8 at 400 GOP/s: 2.5 ms; 100 MB at 50 GB/s: 2 ms -> compute-bound
    roof = bench.roofline(1e9, 100e6, peaks, "int8")
    assert (roof.bound, roof.bound_ms, roof.dot_peak) == ("compute", pytest.approx(2.5), "int8_dot")
    roof = bench.roofline(1e9, 200e6, peaks, "int4")
    assert (roof.bound, roof.bound_ms, roof.dot_peak) == ("bandwidth", pytest.approx(4.0), "int4_dot")
    # no bf16 dot instruction on this backend: its kernels run on fp32 FMA, and so does the bound
    roof = bench.roofline(1e9, 0.0, peaks, "bf16")
    assert (roof.dot_peak, roof.bound_ms) == ("fp32_fma", pytest.approx(10.0))
    assert peaks.best(bench.Peaks(90.0, 5.0, 500.0, 1.0, 40.0)) == bench.Peaks(100.0, 5.0, 500.0, 500.0, 50.0)


def test_contenders_are_timed_interleaved_on_the_same_routing() -> None:
    calls: list[tuple[str, int]] = []
    routes = iter(range(100))

    def contender(name: str) -> bench.Contender:
        return bench.Contender(name, lambda x, ids, w: calls.append((name, int(ids[0, 0]))))

    def make_route() -> tuple[object, object]:
        n = next(routes)
        return np.array([[n, n + 1]]), np.array([[0.5, 0.5]])

    trio = [contender("a"), contender("b"), contender("torch")]
    times, touched = bench.time_interleaved(trio, None, make_route, runs=3, decode=True, lead_in_s=0)
    assert [len(t) for t in times.values()] == [3, 3, 3] and touched == [2, 2, 2]
    # after one warm-up call each: pairs of an untimed lead-in and the timed call, same contender
    lead_in, timed = calls[3::2], calls[4::2]
    assert [name for name, _ in timed] == ["a", "b", "torch", "b", "torch", "a", "torch", "a", "b"]
    assert [name for name, _ in lead_in] == [name for name, _ in timed]
    # one routing per round, a fresh one every round (decode: the weights come from memory); each
    # lead-in on a routing of its own
    assert [route for _, route in timed] == [1, 1, 1, 5, 5, 5, 9, 9, 9]
    assert len({route for _, route in lead_in} | {1, 5, 9}) == len(lead_in) + 3
    calls.clear()
    bench.time_interleaved(trio, None, make_route, runs=2, decode=False)
    assert len({route for _, route in calls}) == 1  # prefill: the same routing throughout


def test_a_decode_call_is_led_in_for_the_lead_in_time() -> None:
    # a virtual machine's idle CPUs need milliseconds of work to run at speed: one call of a
    # millisecond after the gap is not enough on every guest
    calls: list[tuple[float, int]] = []  # (start, routing)
    routes = itertools.count()

    def call(x: object, ids: Any, w: object) -> None:
        calls.append((time.perf_counter(), int(ids[0, 0])))
        time.sleep(0.001)

    def make_route() -> tuple[object, object]:
        return np.array([[next(routes), 0]]), np.array([[0.5, 0.5]])

    def rounds() -> list[list[float]]:
        """The starts of each round's calls, the timed one last: it alone takes the round's
        routing, drawn before its lead-ins' (a smaller number than the call before it)."""
        out: list[list[float]] = [[]]
        for (_, before), (at, route) in itertools.pairwise(calls):
            out[-1].append(at)
            if route < before:
                out.append([])
        return out[:-1]

    lead_in = 0.005
    times, _ = bench.time_interleaved(
        [bench.Contender("a", call)], None, make_route, runs=2, decode=True, lead_in_s=lead_in
    )
    assert len(times["a"]) == 2 and len(rounds()) == 2
    # each round: lead-in calls for at least lead_in_s, then the timed call
    assert all(len(r) >= 2 and r[-1] - r[0] >= lead_in for r in rounds())
    calls.clear()
    bench.time_interleaved([bench.Contender("a", call)], None, make_route, runs=2, decode=False, lead_in_s=lead_in)
    assert len(calls) == 3  # prefill: the warm-up and one call a round, no lead-in


def test_cli_bench_runs_the_activations_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.model, "models", lambda: {"tiny": TINY})
    args = ["--model", "tiny", "--tokens", "1", "--method", "int4", "--repeats", "1", "--threads", "1", "--no-peer"]
    result = CliRunner().invoke(cli.app, ["bench", *args, "--group-size", "32", "--activations", "per-token", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["activations"] == "per-token"
    result = CliRunner().invoke(cli.app, ["bench", "--model", "tiny", "--method", "int4", "--activations", "per-row"])
    assert result.exit_code == 2 and "--activations: 'per-row'; choose from per-block, per-token" in result.stderr


def test_cli_bench_rejects_unknown_models() -> None:
    result = CliRunner().invoke(cli.app, ["bench", "--model", "gpt-5"])
    assert result.exit_code == 2 and "unknown model" in result.stderr


def test_cli_bench_rejects_a_group_size_a_method_does_not_take() -> None:
    result = CliRunner().invoke(cli.app, ["bench", "--method", "int8,int8g", "--group-size", "48"])
    assert result.exit_code == 2 and "--group-size must be 32, 64 or 128, got 48" in result.stderr


def test_cli_bench_names_a_backend_this_machine_cannot_run_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.model, "models", lambda: {"tiny": TINY})
    monkeypatch.delenv("KTFORGE_BLIS_LIBRARY", raising=False)
    compiled = {b["name"] for b in ktforge.build_info()["backends"]}
    # amd-blis without a linked library, or the AMX tiles in a build without them
    backend = "amx" if "amx" not in compiled else "amd-blis"
    args = ["bench", "--model", "tiny", "--tokens", "1", "--method", "int8", "--repeats", "1", "--no-peer"]
    result = CliRunner().invoke(cli.app, [*args, "--backend", backend])
    # an amd-blis build, or an AOCL-BLAS found on this machine whose GEMMs are right here: it runs
    if backend == "amd-blis" and (ktforge.build_info()["blis"] or host.usable_aocl()):
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 2
    assert result.stderr.startswith("kt bench: ") and "Traceback" not in result.output
    assert "not compiled into this build" in result.stderr or "kt build --backend amd-blis" in result.stderr


def test_every_element_has_its_compute_bound() -> None:
    from ktforge import formats

    # kt bench --method takes every format: each element family names the peak that bounds it
    assert set(bench.DOT_PEAK) == set(formats.ELEMENTS)
