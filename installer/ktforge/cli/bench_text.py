"""`kt bench`'s results as text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ktforge.bench import model as catalog


def format_header(header: dict[str, Any]) -> str:
    lines = ["machine peaks (best of the run so far; the rows below use the peaks so far, the summary the run's best):"]
    for simd, by_threads in header["peaks"].items():
        for threads, p in by_threads.items():
            lines.append(
                f"  {simd:9} {threads:>2} thr  fp32 fma {p['fp32_fma']:7.0f} GFLOP/s  bf16 dot {p['bf16_dot']:7.0f} "
                f"GFLOP/s  int8 dot {p['int8_dot']:7.0f}  int4 dot {p['int4_dot']:7.0f} GOP/s  "
                f"read {p['read_gb_per_s']:5.1f} GB/s"
            )
    lines.append(f"  ({header['peak_method']})")
    cells = header.get("node_reads") or []
    if cells:
        text = "; ".join(
            f"node {c['cpu_node']} CPUs ({c['threads']} thr) <- node {c['memory_node']} memory {c['gb_per_s']:.1f}"
            for c in cells
        )
        several = len({c["cpu_node"] for c in cells}) > 1
        bound = " (the read bound: the sum of each node's local cell, as MoE(numa='auto') reads)" if several else ""
        lines.append(f"read bandwidth by NUMA node, GB/s: {text}{bound}")
    for backend, by_threads in header["fixed_cost_us"].items():
        costs = ", ".join(f"{us:.1f} µs on {t} thr" for t, us in by_threads.items())
        lines.append(f"fixed cost per call, {backend}: {costs} (MoE.forward on a tiny layer, median)")
    return "\n".join(lines)


def format_row(r: dict[str, Any]) -> str:
    peer = f"{r['speedup_vs_torch']:5.2f}x" if r["speedup_vs_torch"] is not None else "    -"
    roof = r["roofline"]
    known = catalog.models()
    total = known[r["model"]].experts if r["model"] in known else r["experts_loaded"]
    name = r["model"] if r["experts_loaded"] == total else f"{r['model']}[{r['experts_loaded']}/{total} experts]"
    basis = "read BW" if roof["bound"] == "bandwidth" else roof["dot_peak"]
    if roof.get("in_cache"):
        basis += ", in LLC"  # the weights fit the last-level cache: held to the compute peak alone
    return (
        f"{name:14} {r['method']:5} {r['backend']:9} {r['threads']:>2}thr T={r['tokens']:<5} {r['routing']:7} "
        f"{r['ms']:9.3f} ms (p90 {r['p90_over_median']:4.2f}x, ±{r['spread_pct']:4.1f}%) "
        f"{r['tokens_per_s']:9.0f} tok/s "
        f"{r['gflops']:7.1f} GFLOP/s {r['weight_gb_per_s']:6.1f} GB/s  "
        f"bound {roof['bound_ms']:8.3f} ms ({basis:8}) {share_of_bound(r['pct_of_bound'])}  vs torch {peer}"
    )


def share_of_bound(pct: float, short: bool = False) -> str:
    """A case's share of its bound; above 100% the bound is not one, and is called wrong, not shown."""
    if pct > 100.0:
        return "bound wrong" if short else "faster than its bound: the bound is wrong"
    return f"{pct:.0f}%" if short else f"{pct:5.1f}% of bound"


def format_summary(results: Sequence[dict[str, Any]]) -> str:
    """% of the roofline bound, method x tokens, one table per backend, threads and routing."""
    lines: list[str] = []
    groups: dict[tuple[str, str, int, str], dict[tuple[str, int], float]] = {}
    for r in results:
        key = (r["model"], r["backend"], r["threads"], r["routing"])
        groups.setdefault(key, {})[r["method"], r["tokens"]] = r["pct_of_bound"]
    for (model, backend, threads, kind), cells in groups.items():
        tokens = sorted({t for _, t in cells})
        methods = list(dict.fromkeys(m for m, _ in cells))
        lines.append(
            f"\n% of roofline bound (against the best peaks of the whole run): {model}, {backend}, {threads} threads, "
            f"{kind} routing"
        )
        lines.append("| method | " + " | ".join(f"T={t}" for t in tokens) + " |")
        lines.append("|---|" + "---:|" * len(tokens))
        for m in methods:
            row = [share_of_bound(cells[m, t], short=True) if (m, t) in cells else "-" for t in tokens]
            lines.append(f"| {m} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def format_scaling(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ""
    lines = ["", "scaling (speed-up from the fewest to the most threads; the bound's own ratio beside it):"]
    for s in rows:
        lines.append(
            f"  {s['method']:5} {s['backend']:9} T={s['tokens']:<5} {s['routing']:7} {s['threads'][0]}->"
            f"{s['threads'][1]} threads: {s['speedup']:.2f}x (bound {s['bound_speedup']:.2f}x)"
        )
    return "\n".join(lines)
