"""Bad input raises a clear Python exception and never crashes; edge cases behave as documented."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import ktforge

E, K, H, I = 4, 2, 48, 40


@pytest.fixture(scope="module")
def weights() -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # type: ignore[type-arg]
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((E, I, H)).astype(np.float32) * 0.1,
        rng.standard_normal((E, I, H)).astype(np.float32) * 0.1,
        rng.standard_normal((E, H, I)).astype(np.float32) * 0.1,
    )


@pytest.fixture()
def moe(weights) -> ktforge.MoE:  # type: ignore[no-untyped-def]
    layer = ktforge.MoE(E, K, H, I, method="int8")
    layer.load_weights(*weights)
    return layer


def inputs(T: int = 3):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    return (
        rng.standard_normal((T, H)).astype(np.float32),
        np.tile(np.arange(K), (T, 1)),
        np.full((T, K), 0.5, np.float32),
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_experts": 0}, "num_experts must be a positive integer"),
        ({"top_k": 5}, "top_k (5) cannot exceed num_experts (4)"),
        ({"method": "fp6"}, "method must be one of"),
        ({"backend": "cuda"}, "backend must be one of"),
        ({"method": "int4", "group_size": 48}, "group_size must be 32, 64 or 128"),
        ({"threads": 0}, "threads must be a positive integer"),
    ],
)
def test_bad_constructor_arguments(kwargs, message) -> None:  # type: ignore[no-untyped-def]
    args = {"num_experts": E, "top_k": K, "hidden_size": H, "intermediate_size": I} | kwargs
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ktforge.MoE(**args)


@pytest.mark.parametrize("method", ktforge.formats.names())
def test_a_format_takes_its_own_group_when_none_is_given(method: str) -> None:
    # q4_k's and mxfp4's group is fixed (32), q6_k's 16: not "group_size must be 32, got 128"
    f = ktforge.formats.by_name(method)
    moe = ktforge.MoE(4, 2, 256, 64, method=method)
    expected = 128 if not f.grouped or 128 in f.group_sizes else max(f.group_sizes)
    assert moe._group == expected and moe._down_group == expected
    # a group given is still checked
    if f.grouped and len(f.group_sizes) == 1:
        with pytest.raises(ValueError, match="group_size must be"):
            ktforge.MoE(4, 2, 256, 64, method=method, group_size=f.group_sizes[0] * 2)


def test_forward_before_load() -> None:
    with pytest.raises(RuntimeError, match="before load_weights"):
        ktforge.MoE(E, K, H, I).forward(*inputs())


def test_wrong_weight_shapes_and_dtypes(weights) -> None:  # type: ignore[no-untyped-def]
    gate, up, down = weights
    layer = ktforge.MoE(E, K, H, I)
    with pytest.raises(ValueError, match=r"down has shape \(4, 40, 48\); expected \(4, 48, 40\)"):
        layer.load_weights(gate, up, down.transpose(0, 2, 1).copy())
    with pytest.raises(ValueError, match="dtype float64"):
        layer.load_weights(gate.astype(np.float64), up, down)
    with pytest.raises(ValueError, match="same dtype"):
        layer.load_weights(gate.astype(ml_dtypes.bfloat16), up, down)
    with pytest.raises(ValueError, match="not C-contiguous"):
        layer.load_weights(np.asfortranarray(gate), up, down)
    layer.load_weights(gate.astype(np.float64), up, down, copy=True)  # explicit copy policy


def test_nan_weights_are_refused_at_load(weights) -> None:  # type: ignore[no-untyped-def]
    gate, up, down = (w.copy() for w in weights)
    down[1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="down contains NaN or infinite values"):
        ktforge.MoE(E, K, H, I).load_weights(gate, up, down)


def test_bad_forward_inputs(moe: ktforge.MoE) -> None:
    x, ids, w = inputs()
    with pytest.raises(ValueError, match=r"x has shape \(3, 47\); expected \(T, 48\)"):
        moe.forward(x[:, :47], ids, w)
    with pytest.raises(ValueError, match=r"ids has shape \(3, 1\); expected \(3, 2\)"):
        moe.forward(x, ids[:, :1], w)
    with pytest.raises(ValueError, match="ids must be integers"):
        moe.forward(x, ids.astype(np.float32), w)
    with pytest.raises(ValueError, match="not C-contiguous"):
        moe.forward(np.asfortranarray(x), ids, w)
    with pytest.raises(TypeError, match="numpy array or a torch tensor"):
        moe.forward(x.tolist(), ids, w)
    for dtype in (np.complex64, np.complex128, np.bool_, np.object_):
        with pytest.raises(ValueError, match="weights must be real numbers"):
            moe.forward(x, ids, w.astype(dtype))


@pytest.mark.parametrize("method", ["int8", "int8g", "int4"])
@pytest.mark.parametrize("tiny", [1e-40, 1e-44, 1.4e-45])  # subnormal: max|w| / 127 underflows or its inverse overflows
def test_rows_of_subnormal_weights_quantize_to_zero_and_load(method: str, tiny: float) -> None:
    from ktforge.formats.quantize import quantize

    gate = np.full((E, I, H), tiny, np.float32)
    gate[:, ::2, ::3] = 0.0  # zeros beside them: 0 * inf would be NaN
    up, down = gate.copy(), np.full((E, H, I), tiny, np.float32)
    group = 32 if method != "int8" else 128
    q = quantize(gate, method, group)
    assert q.scale is not None and (q.scale == 1).all()
    assert (q.weight == (0x88 if method == "int4" else 0)).all()
    for load in ("float", "quantized"):
        layer = ktforge.MoE(E, K, H, I, method=method, group_size=group)
        if load == "float":
            layer.load_weights(gate, up, down)
        else:
            layer.load_quantized(*(quantize(w, method, group) for w in (gate, up, down)))
        x, ids, w = inputs()
        assert not layer.forward(x, ids, w).any()


@pytest.mark.parametrize(
    ("bad_id", "dtype"),
    [
        (-1, np.int64),
        (E, np.int64),
        (2**40, np.int64),
        (-1, np.int32),
        (E, np.int32),
        (E, np.uint64),
        (2**63, np.uint64),
    ],
)
def test_expert_id_out_of_range(moe: ktforge.MoE, bad_id: int, dtype: type) -> None:
    x, ids, w = inputs()
    ids = ids.astype(dtype)
    ids[1, 1] = bad_id
    before = x.copy()
    with pytest.raises(ValueError, match=rf"expert id {bad_id} (at token 1 )?is outside \[0, {E}\)"):
        moe.forward(x, ids, w)
    np.testing.assert_array_equal(x, before)


def test_native_layer_checks_ids_itself(moe: ktforge.MoE) -> None:
    # below the Python checks: the extension must not trust its caller either
    x, ids, w = inputs()
    ids[0, 0] = 99
    out = np.empty((3, H), np.float32)
    with pytest.raises(ValueError, match="expert id 99 at token 0 is outside"):
        moe._layer.forward(x, ids, w, out)
    with pytest.raises(ValueError, match="wrong shape"):
        moe._layer.forward(x, ids[:, :1].copy(), w, out)


@pytest.mark.parametrize("where", ["x", "weights"])
def test_nan_inputs_are_refused(moe: ktforge.MoE, where: str) -> None:
    x, ids, w = inputs()
    (x if where == "x" else w)[1, 1] = np.inf
    with pytest.raises(ValueError, match=f"{where} contains NaN or infinite values"):
        moe.forward(x, ids, w)


def test_zero_tokens_give_an_empty_result(moe: ktforge.MoE) -> None:
    x, ids, w = inputs(0)
    y = moe.forward(x, ids, w)
    assert y.shape == (0, H) and y.dtype == np.float32


def test_layer_still_works_after_errors(moe: ktforge.MoE) -> None:
    x, ids, w = inputs()
    before = moe.forward(x, ids, w)
    bad = ids.copy()
    bad[0, 0] = -5
    with pytest.raises(ValueError):
        moe.forward(x, bad, w)
    np.testing.assert_array_equal(moe.forward(x, ids, w), before)


def test_torch_tensors_in_and_out(weights) -> None:  # type: ignore[no-untyped-def]
    import torch  # a test requirement (tests/requirements.txt): missing means failing, not skipping

    layer = ktforge.MoE(E, K, H, I, method="bf16")
    layer.load_weights(*(torch.from_numpy(w).to(torch.bfloat16) for w in weights))
    x, ids, w = inputs()
    y = layer.forward(torch.from_numpy(x).to(torch.bfloat16), torch.from_numpy(ids), torch.from_numpy(w))
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and tuple(y.shape) == (3, H)
    y_np = layer.forward(x.astype(ml_dtypes.bfloat16), ids, w)
    np.testing.assert_array_equal(y.view(torch.int16).numpy(), y_np.view(np.int16))


def test_thread_pool_balances_a_hot_expert(weights) -> None:  # type: ignore[no-untyped-def]
    E2, H2, I2 = 8, 64, 400  # 400 intermediate columns -> several gate/up tasks per expert
    rng = np.random.default_rng(3)
    g = rng.standard_normal((E2, I2, H2)).astype(np.float32) * 0.1
    d = rng.standard_normal((E2, H2, I2)).astype(np.float32) * 0.1
    layer = ktforge.MoE(E2, 2, H2, I2, method="int8", threads=2)
    layer.load_weights(g, g, d)
    x = rng.standard_normal((256, H2)).astype(np.float32)
    skewed = np.zeros((256, 2), np.int64)
    skewed[:, 1] = 1 + np.arange(256) % 7  # expert 0 takes every token
    w = np.full((256, 2), 0.5, np.float32)
    y = layer.forward(x, skewed, w)
    counts = layer._layer.gate_up_task_counts()
    # the hot expert is split into (row chunk, column block) tasks, so there is work for both
    assert len(counts) == 2 and sum(counts) >= 2 * 4
    from ..moe_reference import expected

    ref = expected(x, skewed, w, g, g, d, "int8")
    assert float(np.abs(y - ref).max() / np.abs(ref).max()) < 2e-3


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_every_pool_thread_takes_work_while_others_are_busy(threads: int) -> None:
    from ktforge import _native

    counts, first = _native.thread_pool_selftest(threads, 50)
    assert len(counts) == threads and sum(counts) == 50
    assert min(counts) >= 1
    # each thread starts on its own contiguous share (it streams its own experts' weights)
    assert first == [50 * i // threads for i in range(threads)]


def _anon_huge_kib() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError("no AnonHugePages in /proc/self/smaps_rollup")


def test_packed_weights_are_backed_by_huge_pages_where_linux_allows() -> None:
    # A forward streams the experts' weights: one TLB entry per 2 MiB instead of per 4 KiB.
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    mode = thp[thp.index("[") + 1 : thp.index("]")]
    rng = np.random.default_rng(5)
    E2, H2, I2 = 4, 1024, 1024  # 4 x 6 MiB of bf16 gate, up and down
    g = rng.standard_normal((E2, I2, H2), dtype=np.float32)
    d = rng.standard_normal((E2, H2, I2), dtype=np.float32)
    before = _anon_huge_kib()
    layer = ktforge.MoE(E2, 2, H2, I2, method="bf16", threads=1)
    layer.load_weights(g, g, d)
    assert layer.info["huge_pages_advised"] is True
    if mode != "never":  # "always" or "madvise": the advice is taken (compaction permitting: most of it)
        assert _anon_huge_kib() - before >= 12 * 1024, mode
