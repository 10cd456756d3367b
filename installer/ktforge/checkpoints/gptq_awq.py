"""GPTQ's and AWQ's own INT4 layouts (``quantization_config.quant_method`` "gptq" or "awq"): one set
of tensors a linear layer, named from its weight's name without ``.weight``:

- GPTQ (AutoGPTQ, GPTQModel): ``qweight`` int32 [K / 8, N], value k = 8i + j of column n at bits
  4j of word [i, n]; ``qzeros`` int32 [G, N / 8], column n = 8j + t at bits 4t; ``scales`` float16
  [G, N]; ``g_idx`` int32 [K], each input's group. ``checkpoint_format`` "gptq" (v1, the default)
  stores zero - 1 (modulo 16), "gptq_v2" the zero.
- AWQ (AutoAWQ's GEMM version): ``qweight`` int32 [K, N / 8] and ``qzeros`` int32 [G, N / 8],
  column 8c + ORDER[i] at bits 4i of word c with ORDER = 0, 2, 4, 6, 1, 3, 5, 7; ``scales``
  float16 [G, N]; the zero as stored.

Both are ``w[n, k] = (q - zero) * scale`` of k's group, read here into int4z's layout exactly.
GPTQ's act-order (``desc_act``: ``g_idx`` not k // group, each group a scattered set of inputs) is
read with its columns sorted by group, so each group is contiguous, and that order returned: the
layer takes its inputs in it (``MoE.load_input_order``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ktforge.files import shown

Array = np.ndarray[Any, Any]
QWEIGHT, QZEROS, SCALES, G_IDX = ".qweight", ".qzeros", ".scales", ".g_idx"
SUFFIXES = (QWEIGHT, QZEROS, SCALES, G_IDX)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True)
class Scheme:
    """ "gptq" or "awq", the group size, and what a stored zero point is short of the zero (GPTQ v1: 1)."""

    method: str
    group: int
    zero_offset: int


def scheme_of(quantization: dict[str, Any], where: str) -> Scheme | None:
    """The scheme of a GPTQ or AWQ ``quantization_config``, None for any other; ValueError for one
    ktforge cannot read."""
    method = quantization.get("quant_method")
    if method not in ("gptq", "awq"):
        return None
    bits = quantization.get("bits", quantization.get("w_bit"))
    group = quantization.get("group_size", quantization.get("q_group_size"))
    if bits != 4:
        raise ValueError(f"{where}: {method} with {bits}-bit weights; ktforge serves 4-bit")
    if not isinstance(group, int) or isinstance(group, bool) or not 0 < group < 2**31:
        raise ValueError(f"{where}: {method} group_size {shown(group)}; ktforge serves groups of K (not per channel)")
    if method == "awq":
        version = str(quantization.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"{where}: AWQ version {shown(version)}; ktforge reads the GEMM layout")
        return Scheme("awq", group, 0)
    layout = quantization.get("checkpoint_format", "gptq")
    if layout not in ("gptq", "gptq_v2"):
        raise ValueError(f"{where}: GPTQ checkpoint_format {shown(layout)}; ktforge reads gptq and gptq_v2")
    return Scheme("gptq", group, 1 if layout == "gptq" else 0)


def _nibbles(words: Array) -> Array:
    """int32 words [..., W] -> their 4-bit values [..., 8 W], value j of word w at 8 w + j."""
    raw = np.ascontiguousarray(words).view("<u1")
    return np.stack([raw & 0x0F, raw >> 4], axis=-1).reshape(*words.shape[:-1], -1)


def _portable(q: Array) -> Array:
    """Unsigned values [N, K] (K even) -> two a byte, even k in the low nibble."""
    packed: Array = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return packed


def unpack(scheme: Scheme, tensors: dict[str, Array], N: int, K: int) -> tuple[Array, Array, Array, Array | None]:
    """(codes uint8 [N, K / 2] in int4's byte order, scales [N, G] as stored, zero points uint8
    [N, G] in [0, 15], and for act-order the input each column of the codes takes, else None) of
    one linear layer's GPTQ or AWQ tensors (keyed by suffix); ValueError for shapes that do not fit
    [N, K], or a g_idx whose groups are not all ``group`` inputs."""
    group = scheme.group
    G = K // group
    if K % group or K % 8 or N % 8:
        raise ValueError(f"[{N}, {K}] is not whole groups of {group} (and 8s) for {scheme.method}")
    qweight, qzeros, scales = tensors[QWEIGHT], tensors[QZEROS], tensors[SCALES]
    want = {QWEIGHT: (K // 8, N) if scheme.method == "gptq" else (K, N // 8), QZEROS: (G, N // 8), SCALES: (G, N)}
    for suffix, shape in want.items():
        if tensors[suffix].shape != shape:
            raise ValueError(f"{suffix[1:]} has shape {list(tensors[suffix].shape)}; [{N}, {K}] needs {list(shape)}")
    order = None
    if scheme.method == "gptq":
        # words [K/8, N], byte b of word [i, n] holding k = 8i + 2b (low) and 8i + 2b + 1: per column,
        # the bytes in i, b order are int4's portable layout already
        codes = np.ascontiguousarray(qweight).view("<u1").reshape(K // 8, N, 4).transpose(1, 0, 2).reshape(N, K // 2)
        zeros = (_nibbles(qzeros) + scheme.zero_offset) & 0x0F
        g_idx = tensors.get(G_IDX)
        g_idx = None if g_idx is None else np.asarray(g_idx, dtype=np.int64).reshape(-1)
        if g_idx is not None and not np.array_equal(g_idx, np.arange(K) // group):
            if g_idx.shape != (K,) or g_idx.min(initial=0) < 0 or g_idx.max(initial=0) >= G:
                raise ValueError(f"its g_idx is not {K} group numbers in 0..{G - 1}")
            if not np.array_equal(np.bincount(g_idx, minlength=G), np.full(G, group)):
                raise ValueError(f"its g_idx does not put {group} inputs in each of {G} groups")
            order = np.argsort(g_idx, kind="stable")  # column j of the sorted codes is input order[j]
            q = _nibbles(qweight.T.copy()).reshape(N, K)  # [N, K] in input order
            codes = _portable(np.ascontiguousarray(q[:, order]))
    else:
        columns = (np.arange(N).reshape(-1, 8)[:, list(AWQ_ORDER)]).reshape(-1)  # value 8c + i: column columns[8c + i]
        q = np.empty((K, N), np.uint8)
        q[:, columns] = _nibbles(qweight)
        codes = _portable(np.ascontiguousarray(q.T))
        zeros = np.empty((G, N), np.uint8)
        zeros[:, columns] = _nibbles(qzeros)
    return np.ascontiguousarray(codes), np.ascontiguousarray(np.asarray(scales).T), np.ascontiguousarray(zeros.T), order


def dense(scheme: Scheme, tensors: dict[str, Array], N: int, K: int) -> Array:
    """One linear layer's GPTQ or AWQ tensors as float32 values [N, K], ``w[n, k] = (q - zero) *
    scale`` of k's group. A GPTQ ``g_idx`` may put any inputs in any group, as a tensor-parallel
    rank's slice of an act-order layer has them (its K inputs, every group's scales and zeros)."""
    if scheme.method != "gptq":
        codes, scale, zero, _ = unpack(scheme, tensors, N, K)
        q = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(N, K // scheme.group, scheme.group)
        values: Array = ((q - zero[..., None].astype(np.float32)) * scale.astype(np.float32)[..., None]).reshape(N, K)
        return values
    qweight, qzeros, scales = (np.asarray(tensors[s]) for s in (QWEIGHT, QZEROS, SCALES))
    G = scales.shape[0]
    g_idx = tensors.get(G_IDX)
    g = np.arange(K) // scheme.group if g_idx is None else np.asarray(g_idx, dtype=np.int64).reshape(-1)
    if qweight.shape != (K // 8, N) or g.shape != (K,) or qzeros.shape != (G, N // 8) or scales.shape != (G, N):
        raise ValueError(
            f"GPTQ tensors qweight {list(qweight.shape)}, g_idx {list(g.shape)}, qzeros {list(qzeros.shape)}, "
            f"scales {list(scales.shape)} do not fit [{N}, {K}]"
        )
    if K and (g.min() < 0 or g.max() >= G):
        raise ValueError(f"its g_idx names groups outside 0..{G - 1}")
    q = _nibbles(np.ascontiguousarray(qweight.T)).astype(np.float32)  # [N, K]
    zeros = ((_nibbles(qzeros) + scheme.zero_offset) & 0x0F).astype(np.float32)  # [G, N]
    result: Array = (q - zeros[g].T) * scales.astype(np.float32)[g].T
    return result


def group_counts(g_idx: Array, groups: int) -> Array:
    """How many of a GPTQ layer's inputs (or of a tensor-parallel rank's share of them) each of its
    ``groups`` groups holds; ValueError for a g_idx naming other groups."""
    g = np.asarray(g_idx, dtype=np.int64).reshape(-1)
    if g.size and (g.min() < 0 or g.max() >= groups):
        raise ValueError(f"its g_idx names groups outside 0..{groups - 1}")
    counts: Array = np.bincount(g, minlength=groups)
    return counts


def regrouped_size(counts: Array, sizes: tuple[int, ...]) -> tuple[int, int]:
    """(group, K) for a rank's share of act-order inputs (``counts``: [experts, groups], how many of
    each group it holds), each group's inputs made contiguous and padded to whole groups of the
    returned size: the largest of ``sizes`` that pads no more than the smallest does; K is the
    most any expert needs."""

    def padded(size: int) -> int:
        return int((-(-counts // size) * size).sum(axis=-1).max(initial=0))

    least = padded(min(sizes))
    group = max(size for size in sizes if padded(size) == least)
    return group, least


def unpack_regrouped(
    scheme: Scheme, tensors: dict[str, Array], N: int, K: int, group: int, length: int
) -> tuple[Array, Array, Array, Array]:
    """A GPTQ layer whose K inputs are any of its groups' (a tensor-parallel rank's share of an
    act-order layer, every group's scales and zero points beside them) as int4z's layout over
    ``length`` inputs in groups of ``group``: each group's inputs together, then padding to a whole
    ``group`` (codes equal to the zero point, so padding weighs 0), then groups of scale 0 up to
    ``length``. Returns (codes [N, length / 2], scales [N, length / group], zero points uint8
    [N, length / group], and for each of the ``length`` columns the input it takes, -1 for padding)."""
    qweight, qzeros, scales = (np.asarray(tensors[s]) for s in (QWEIGHT, QZEROS, SCALES))
    G = scales.shape[0]
    g = np.asarray(tensors[G_IDX], dtype=np.int64).reshape(-1)
    if scheme.method != "gptq" or qweight.shape != (K // 8, N) or g.shape != (K,) or qzeros.shape != (G, N // 8):
        raise ValueError(
            f"{scheme.method} tensors qweight {list(qweight.shape)}, g_idx {list(g.shape)}, "
            f"qzeros {list(qzeros.shape)}, scales {list(scales.shape)} do not fit [{N}, {K}]"
        )
    counts = group_counts(g, G)
    need = int((-(-counts // group) * group).sum())
    if need > length or length % group:
        raise ValueError(f"its inputs need {need} columns in groups of {group}; the layer has {length}")
    sorted_inputs = np.argsort(g, kind="stable")
    order = np.full(length, -1, np.int64)
    column_group = np.full(length // group, -1, np.int64)  # each new group's old group (-1: none)
    at = 0
    for old, count in enumerate(counts):
        if count == 0:
            continue
        first = int(counts[:old].sum())
        order[at : at + count] = sorted_inputs[first : first + count]
        span = -(-int(count) // group) * group
        column_group[at // group : (at + span) // group] = old
        at += span
    q = _nibbles(np.ascontiguousarray(qweight.T)).reshape(N, K)  # [N, K] in input order
    zeros = ((_nibbles(qzeros) + scheme.zero_offset) & 0x0F).T  # [N, G]
    used = column_group >= 0
    new_zero = np.full((N, length // group), 8, np.uint8)
    new_zero[:, used] = zeros[:, column_group[used]]
    new_scale = np.zeros((N, length // group), np.float32)
    new_scale[:, used] = scales.T[:, column_group[used]].astype(np.float32)
    codes = np.repeat(new_zero, group, axis=1)  # padding: the zero point, w = 0
    real = order >= 0
    codes[:, real] = q[:, order[real]]
    return _portable(codes), new_scale, new_zero, order
