"""MoE(numa=...) on virtual nodes: two shares over disjoint CPUs of this machine's one node, each
with its own pinned threads and its columns of every expert in memory asked of its node. The
result equals the one-pool layer's to the bit in every format and backend; the pages lie where
the policy put them (move_pages, read back through MoE.info); the threads run where they were
pinned (/proc); a forked child computes the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ktforge
from ktforge import formats
from ktforge.detect import blis
from ktforge.detect.topology import read_live
from ktforge.kernels.numa import NumaShare

from .. import host

BACKENDS = [b for b in host.tested_backends() if b != "amd-blis"]  # amd-blis: its own test below
E, K = 8, 2
MPOL_PREFERRED = 1


def _two_cpus() -> list[int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.fail(f"virtual NUMA nodes need two CPUs; this process may use {cpus}")
    return cpus[:2]


def virtual_nodes() -> list[NumaShare]:
    first, second = _two_cpus()
    return [NumaShare([first], 0), NumaShare([second], 0)]


def _layer(H: int, I: int, seed: int = 0) -> tuple[np.ndarray[Any, Any], ...]:
    rng = np.random.default_rng(seed)
    gate, up = (rng.standard_normal((E, I, H)).astype(np.float32) / 8 for _ in range(2))
    return gate, up, rng.standard_normal((E, H, I)).astype(np.float32) / 8


def _inputs(T: int, H: int, seed: int = 1) -> tuple[np.ndarray[Any, Any], ...]:
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int64)
    return rng.standard_normal((T, H)).astype(np.float32), ids, rng.random((T, K)).astype(np.float32)


def _pair(method: str, backend: str, H: int, I: int) -> tuple[ktforge.MoE, ktforge.MoE]:
    weights = _layer(H, I)
    one = ktforge.MoE(E, K, H, I, method=method, backend=backend, threads=2, numa="off")
    split = ktforge.MoE(E, K, H, I, method=method, backend=backend, numa=virtual_nodes())
    for moe in (one, split):
        moe.load_weights(*weights)
    return one, split


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", formats.names())
def test_virtual_nodes_give_the_one_pool_result_to_the_bit(backend: str, method: str) -> None:
    H, I = 256, 200  # I: 13 gate/up block pairs, split 6 and 7
    one, split = _pair(method, backend, H, I)
    for T in (1, 5, 40):
        x, ids, w = _inputs(T, H, seed=T)
        assert np.array_equal(one.forward(x, ids, w), split.forward(x, ids, w)), f"{T} tokens"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["bf16", "int8", "int4", "fp8", "q4_k", "mxfp4"])
def test_prefill_on_virtual_nodes_is_the_one_pool_result(backend: str, method: str) -> None:
    H, I = 512, 320  # enough tokens per expert for the tile and prefill kernels
    one, split = _pair(method, backend, H, I)
    x, ids, w = _inputs(300, H, seed=3)
    assert np.array_equal(one.forward(x, ids, w), split.forward(x, ids, w))


def test_aocl_whole_experts_run_within_the_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    """amd-blis: AOCL-BLAS computes whole experts from its own copy, one share's threads each."""
    found = [lib for lib in (blis.summarize(c) for c in blis.discover()["candidates"]) if lib["has_addon"]]
    assert found, "AOCL-BLAS with aocl_gemm is required: python -m pip install aoclda"
    monkeypatch.setenv("KTFORGE_BLIS_LIBRARY", str(found[0]["path"]))
    monkeypatch.setenv("KTFORGE_AOCL_MIN_TOKENS", "1")  # every expert through AOCL in both layers
    one, split = _pair("bf16", "amd-blis", 512, 256)
    assert split.info["kernel"].startswith("aocl_gemm_")
    x, ids, w = _inputs(60, 512, seed=4)
    assert np.array_equal(one.forward(x, ids, w), split.forward(x, ids, w))


def test_amd_blis_on_virtual_nodes_as_a_user_gets_it() -> None:
    """No variable set: the library an amd-blis build links, else the one the report found, AOCL's
    threshold measured by each layer (so float-close); refused by name where none is usable."""
    usable = ktforge.build_info()["blis"] or host.usable_aocl()
    if not usable:
        with pytest.raises(ValueError, match=r"kt build --backend amd-blis|gives wrong results|is refused"):
            ktforge.MoE(E, K, 512, 256, method="int8", backend="amd-blis", numa=virtual_nodes())
        return
    one, split = _pair("bf16", "amd-blis", 512, 256)
    assert len(split.info["numa_shares"]) == 2 and split.info["name"] == "amd-blis"
    x, ids, w = _inputs(200, 512, seed=5)
    expected = one.forward(x, ids, w)
    np.testing.assert_allclose(split.forward(x, ids, w), expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_each_share_holds_its_columns_in_pages_of_its_node() -> None:
    H, I = 512, 640
    _, split = _pair("bf16", "reference", H, I)
    shares = split.info["numa_shares"]
    assert [s["cpus"] for s in shares] == [[c] for c in _two_cpus()]
    assert [s["intermediate_columns"] for s in shares] == [320, 320]
    assert [s["hidden_columns"] for s in shares] == [256, 256]
    per_share = E * (2 * 320 * H + 256 * I) * 2  # bf16 bytes of each share's gate, up and down
    assert [s["bytes"] for s in shares] == [per_share, per_share]
    for share in shares:
        assert share["node_requested"], "mbind(MPOL_PREFERRED) was refused"
        assert share["policy_mode"] == MPOL_PREFERRED  # get_mempolicy(MPOL_F_ADDR) on the share
        assert share["pages_sampled"] > 0 and share["pages_on_node"] == share["pages_sampled"]  # move_pages


@pytest.mark.parametrize("method", ["q8_0", "int4", "int8", "fp8", "q4_k", "mxfp4"])
def test_each_share_holds_its_scales_in_pages_of_its_node_too(method: str) -> None:
    # the scales, sums and records beside the values: 3% of an int4 matrix's bytes, 6% of a Q8_0's
    H, I = 512, 640
    one, split = _pair(method, "reference", H, I)
    shares = split.info["numa_shares"]
    values = E * (2 * 320 * H + 256 * I) * formats.by_name(method).bits // 8  # each share's codes alone
    assert all(s["bytes"] > values for s in shares), [s["bytes"] for s in shares]
    assert split.info["packed_bytes"] == one.info["packed_bytes"]  # the same bytes, only placed
    for share in shares:
        assert share["pages_sampled"] > 0 and share["pages_on_node"] == share["pages_sampled"]
    x, ids, w = _inputs(40, H, seed=3)
    assert np.array_equal(split.forward(x, ids, w), one.forward(x, ids, w))


def _thread_cpus() -> list[str]:
    lists = []
    for status in Path("/proc/self/task").glob("*/status"):
        for line in status.read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                lists.append(line.split(":", 1)[1].strip())
    return lists


def test_each_shares_workers_are_pinned_to_its_cpus() -> None:
    second = _two_cpus()[1]
    before = _thread_cpus().count(str(second))
    _, split = _pair("int8", "auto", 256, 128)
    # share 0's one thread is the caller's; share 1's is a worker pinned to its CPU
    assert _thread_cpus().count(str(second)) == before + 1
    assert split.info["threads"] == 2


def test_one_node_and_off_keep_one_pool() -> None:
    auto = ktforge.MoE(E, K, 256, 128, method="int8")
    if len(read_live().usable_nodes()) > 1:
        pytest.fail("this machine has several NUMA nodes: run the multi-node checks in docs/numa.md instead")
    assert auto.numa == [] and auto.info["numa_shares"] == []
    assert ktforge.MoE(E, K, 256, 128, numa="off").info["numa_shares"] == []


def test_a_forked_child_computes_the_same_on_its_own_pools() -> None:
    first, second = _two_cpus()
    code = f"""
        import json, os, numpy as np, ktforge
        from ktforge.kernels.numa import NumaShare
        rng = np.random.default_rng(0)
        moe = ktforge.MoE(8, 2, 256, 128, method="int4", numa=[NumaShare([{first}], 0), NumaShare([{second}], 0)])
        moe.load_weights(*(rng.standard_normal(s).astype(np.float32) for s in [(8, 128, 256)] * 2 + [(8, 256, 128)]))
        x = rng.standard_normal((9, 256)).astype(np.float32)
        ids = np.stack([rng.permutation(8)[:2] for _ in range(9)]).astype(np.int64)
        w = rng.random((9, 2)).astype(np.float32)
        parent = moe.forward(x, ids, w)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if np.array_equal(moe.forward(x, ids, w), parent) else 3)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({{"child": os.waitstatus_to_exitcode(status)}}))
        """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"child": 0}


@pytest.mark.parametrize("name", ["qwen3moe-Q4_K.gguf", "qwen3moe-Q8_0.gguf"])
def test_a_file_is_split_at_load_whatever_the_node_count(name: str) -> None:
    """A GGUF made by llama.cpp's quantizer, served on virtual nodes: the same as one pool."""
    path = Path(__file__).parent.parent / "fixtures" / "gguf" / name
    one = ktforge.MoE.from_pretrained(path, 0, numa="off")
    split = ktforge.MoE.from_pretrained(path, 0, numa=virtual_nodes())
    assert split.info["numa_shares"] and one.info["numa_shares"] == []
    x, ids, w = _inputs(7, one.hidden_size)
    ids %= one.num_experts
    assert np.array_equal(one.forward(x, ids, w), split.forward(x, ids, w))


def test_layers_with_the_same_shares_share_their_pools() -> None:
    shares = virtual_nodes()
    layers = [ktforge.MoE(E, K, 256, 128, method="int8", numa=shares) for _ in range(3)]
    assert [layer.info["pool_layers"] for layer in layers] == [3, 3, 3]
