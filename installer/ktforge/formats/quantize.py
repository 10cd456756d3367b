"""Weight quantization, defined once for the converter and for loading: the portable layout
of each format's element family (the format table, :mod:`ktforge.formats`, says which).

int8 and int4 are computed by the extension's ``quantize_weight_row`` — the function the
kernels' packer applies to float weights — so weights quantized here and loaded with
``MoE.load_quantized`` give exactly the results of ``MoE.load_weights`` on the float weights
(tests hold both to bit equality, and to an independent NumPy definition).

Layout, for a projection of ``N`` output rows and ``K`` inputs (``[..., N, K]`` in, as in
Hugging Face checkpoints):
- bf16: ``weight`` bfloat16 ``[..., N, K]`` (round to nearest even), no scale.
- int8: ``weight`` int8 ``[..., N, K]``, symmetric per output row: ``scale`` float32
  ``[..., N]`` = max|w| / 127 (1 where that is below the smallest normal float: an all-zero or
  subnormal row, zero to float32 accuracy), ``q = clip(rint(w * (1 / scale)), ±127)``.
- int8g: ``weight`` int8 ``[..., N, K]``, symmetric per (row, group) of K zero-padded to ``Kg``:
  ``scale`` bfloat16 ``[..., N, Kg / group]`` = max|w| / 127 rounded to bfloat16 (1 for a
  group of zeros), ``q = clip(rint(w * (1 / scale)), ±127)``: llama.cpp's Q8_0 at group 32,
  with its 1.0625 bytes a weight.
- int4: K zero-padded to ``Kg``, a multiple of ``group``; per (row, group), all 16 codes as
  llama.cpp's Q4_0 uses them: ``scale`` bfloat16 ``[..., N, Kg / group]`` = ``-m / 8`` for the
  group's first value ``m`` of the largest magnitude, rounded to bfloat16 (1 for a group of
  zeros); ``q = clip(rint(w * (1 / scale)), -8, 7)`` (``m``'s code is -8), stored as ``q + 8``,
  two per byte, even k in the low nibble: ``weight`` uint8 ``[..., N, Kg / 2]``. 16-bit
  scales make group 32 take 0.5625 bytes a weight and steps of max|w| / 8, both Q4_0's.
- mxfp4 (element fp4): OCP MXFP4, K zero-padded to ``Kg``, a multiple of 32: ``weight`` uint8
  ``[..., N, Kg / 2]``, two E2M1 codes a byte (even k in the low nibble: gpt-oss's ``*_blocks``
  and compressed-tensors' bytes), ``scale`` uint8 ``[..., N, Kg / 32]``, E8M0 codes (2^(e - 127)).
  Quantized here per group: the least power of two 2^s with max|w| / 2^s <= 6, each value the
  E2M1 code nearest w / 2^s (ties to even).
- nvfp4: NVIDIA's NVFP4, K zero-padded to a multiple of 16: ``weight`` uint8 ``[..., N, Kg / 2]``,
  mxfp4's E2M1 code pairs, ``scale`` uint8 ``[..., N, Kg / 16]``, UE4M3 codes (FP8 E4M3 without
  its sign), and ``global_scale`` float32 ``[..., N]``, the tensor's scale (ModelOpt's
  ``weight_scale_2``) for each row: ``w = e2m1 * ue4m3 * global``. Quantized here a row at a time as
  ModelOpt quantizes a tensor: global = max|w| / (6 * 448), per 16 values the UE4M3 of their
  max|w| / 6 / global, each value the E2M1 code nearest.
- mxfp8: OCP MXFP8 (MiniMax-M3's release, compressed-tensors' ``mxfp8-quantized``, ModelOpt's
  MXFP8): ``weight`` float8_e4m3fn ``[..., N, K]``, ``scale`` uint8 ``[..., N, Kg / 32]``, E8M0 codes
  (2^(e - 127)). Quantized here per group: the least power of two 2^s with max|w| / 2^s <= 448, the
  codes E4M3 of w / 2^s (round to nearest even).
- int4z: asymmetric INT4 (GPTQ, AWQ, compressed-tensors' asymmetric schemes), K zero-padded to
  ``Kg``: ``weight`` uint8 ``[..., N, Kg / 2]``, unsigned codes q in [0, 15] two a byte (even k
  low), ``scale`` float32 and ``zero`` uint8 (in [0, 15]) ``[..., N, Kg / group]``: ``w = (q -
  zero) * scale``. A checkpoint's own, repacked: float weights are not converted to it.
- q8_0 (element int8h): GGUF's Q8_0, int8g's layout with float16 scales: ``weight`` int8 ``[..., N,
  K]``, ``scale`` float16 ``[..., N, Kg / 32]``. A GGUF's own, repacked; MoE.load_weights packs
  floats to it (d = max|w| / 127 in float16).
- q4_k (element q4k): GGUF's Q4_K, K zero-padded to ``Kg``, a multiple of 256: ``weight`` uint8
  ``[..., N, Kg / 2]``, unsigned codes q in [0, 15] two a byte (even k low, as int4z), ``scale``
  uint8 ``[..., N, Kg / 256, 20]``, a record a super-block: d and dmin (float16, little endian),
  then sc[8] and m[8] (6-bit, one a group of 32): ``w = d * sc * q - dmin * m``. A GGUF's own,
  repacked (:mod:`ktforge.checkpoints.gguf_quants`); MoE.load_weights packs floats to it.
- q5_k (element q5k): GGUF's Q5_K, q4_k's layout but for its ``weight``: uint8 ``[..., N, Kg]``,
  one unsigned 5-bit code q in [0, 31] a byte, ``w = d * sc * q - dmin * m``. A GGUF's own,
  repacked; MoE.load_weights packs floats to it.
- iq4_nl (element iq4nl): GGUF's IQ4_NL, K zero-padded to ``Kg``, a multiple of 32: ``weight``
  uint8 ``[..., N, Kg / 2]``, two codes of the IQ4 grid (``IQ4_VALUES``) a byte (even k low),
  ``scale`` float16 ``[..., N, Kg / 32]``: ``w = scale * IQ4_VALUES[q]``. A GGUF's own, repacked;
  MoE.load_weights packs floats to it.
- iq4_xs (element iq4xs): GGUF's IQ4_XS, K zero-padded to a multiple of 256: ``weight`` as
  iq4_nl's, ``scale`` uint8 ``[..., N, Kg / 256, 10]``, a record a super-block: d (float16), then
  sc[8] (int8, ls - 32, one a group of 32): ``w = d * sc * IQ4_VALUES[q]``.
- q6_k (element q6k): GGUF's Q6_K, K zero-padded to ``Kg``, a multiple of 256: ``weight`` uint8
  ``[..., N, Kg]``, one unsigned 6-bit code q in [0, 63] a byte, ``scale`` uint8 ``[..., N, Kg / 256,
  18]``, a record a super-block: d (float16, little endian), then sc[16] (int8, one a group of
  16): ``w = d * sc * (q - 32)``. A GGUF's own, repacked; MoE.load_weights packs floats to it.
- q3_k (element q3k): GGUF's Q3_K, q6_k's layout and records (sc: the file's 6-bit scale less 32),
  the codes q in [0, 7] (two low bits, and 4 where the file's hmask bit is set): ``w = d * sc * (q -
  4)``. A GGUF's own, repacked; MoE.load_weights packs floats to it.
- q2_k (element q2k): GGUF's Q2_K, K zero-padded to a multiple of 256: ``weight`` uint8 ``[..., N,
  Kg]``, one code q in [0, 3] a byte, ``scale`` uint8 ``[..., N, Kg / 256, 20]``, a record a
  super-block: d and dmin (float16), then a byte a group of 16 as the file has it, sc in its low
  nibble and m in its high: ``w = d * sc * q - dmin * m``. A GGUF's own, repacked;
  MoE.load_weights packs floats to it.
- iq2_xxs, iq2_xs, iq3_xxs, iq1_s (elements iq2xxs, iq2xs, iq3xxs, iq1s): GGUF's i-quants, K
  zero-padded to a multiple of 256: ``weight`` uint8 ``[..., N, Kg / 256 * (block bytes - 2)]``,
  the file's blocks (66, 74, 98, 50 bytes) less their float16 d, as the file has them, ``scale``
  float16 ``[..., N, Kg / 256]``, the d (:func:`lattice_values` dequantizes them as
  ggml-quants.c does). A GGUF's own; MoE.load_weights and this module's ``quantize`` pack floats
  to the same blocks (a nearest-grid-point search; llama.cpp's quantizer, with an importance
  matrix, writes the files people download).
- q4_0, q4_1, q5_0, q5_1 (elements q40, q41, q50, q51): GGUF's Q4_0, Q4_1, Q5_0 and Q5_1, K
  zero-padded to ``Kg``, a multiple of 32: ``weight`` uint8 ``[..., N, Kg / 2]``, unsigned codes
  two a byte (even k low; q5_0, q5_1: ``[..., N, Kg]``, one 5-bit code a byte), ``scale`` float16
  ``[..., N, Kg / 32]``: ``w = d * (q - 8)`` (q5_0: ``q - 16``); q4_1, q5_1: ``scale`` float16
  ``[..., N, Kg / 32, 2]``, d and m: ``w = d * q + m``. A GGUF's own, repacked; MoE.load_weights
  packs floats to them.
- f16, f32: GGUF's F16 and F32, ``weight`` float16 or float32 ``[..., N, K]``, no scale. A GGUF's own;
  MoE.load_weights packs floats to them (f16: rounded to nearest even, within float16's range).
- fp8: a checkpoint's own FP8 E4M3 codes, ``weight`` float8_e4m3fn ``[..., N, K]``, and its
  scales as float32 ``[..., N, Kg / group]``, one per row and group of K (a 128 x 128 block's
  scale repeated over its rows, a channel's over its groups): a repack, not a quantization.

A checkpoint's own INT4 (compressed-tensors' symmetric ``pack-quantized``, Kimi-K2-Thinking's)
is int4's layout already: its codes are ``q + 8`` two a byte, even k low, and its scales, where
bfloat16 holds them exactly, are int4's. :class:`Int4Groups` repacks it bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ktforge import formats
from ktforge.formats.lattice_values import LATTICE_BLOCK_BYTES, lattice_values

METHODS = formats.names()
# E2M1 (MXFP4's element): sign, two exponent bits, one mantissa bit
# the IQ4 grid (llama.cpp's kvalues_iq4nl): IQ4_NL's and IQ4_XS's values
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Quantized:
    """One projection's weights in the portable layout; ``scale`` is None for bf16, ``zero`` (the
    zero points) for all but int4z."""

    weight: Array
    scale: Array | None
    zero: Array | None = None
    # the input each column of ``weight`` takes (GPTQ's act-order, groups made contiguous); None:
    # column k is input k. Not a stored part: the layer takes its inputs in that order.
    order: Array | None = None
    global_scale: Array | None = None  # nvfp4's tensor scale, one a row

    def parts(self) -> dict[str, Array]:
        """``{"weight": ..., "scale": ..., "zero": ..., "global_scale": ...}``, without the parts the
        format does not have."""
        named = {"weight": self.weight, "scale": self.scale, "zero": self.zero, "global_scale": self.global_scale}
        return {name: part for name, part in named.items() if part is not None}

    @classmethod
    def named(cls, arrays: dict[str, Array], prefix: str) -> Quantized:
        """The parts ``{prefix}.weight``, ``.scale``, ... of a dict of arrays (what parts() wrote)."""
        return cls(
            arrays[f"{prefix}.weight"],
            arrays.get(f"{prefix}.scale"),
            arrays.get(f"{prefix}.zero"),
            global_scale=arrays.get(f"{prefix}.global_scale"),
        )


@dataclass(frozen=True)
class Fp8Blocks:
    """FP8 E4M3 weights ``[N, K]`` (as their uint8 codes) with float32 block scales
    ``[ceil(N / rows), ceil(K / cols)]``: DeepSeek-V3's ``weight`` and ``weight_scale_inv``."""

    codes: Array
    scale: Array
    block: tuple[int, int]

    def to_float32(self) -> Array:
        import ktforge._native as _native

        return _native.dequantize_fp8(self.codes, self.scale, *self.block)

    def per_row(self, group: int) -> Quantized:
        """fp8's portable layout, losslessly: the codes, and each row's scale for each group of
        ``group`` values of K (block scales repeated over their rows; a channel's scale over
        its groups). The blocks must hold whole groups: K-blocks of ``group``, or one over K."""
        import ml_dtypes

        (bn, bk), (N, K) = self.block, self.codes.shape
        groups = -(-K // group)
        if bk == group or (bk >= K and self.scale.shape[1] == 1):
            per_group = self.scale if bk == group else np.repeat(self.scale, groups, axis=1)
        else:
            raise ValueError(
                f"FP8 blocks of {bn}x{bk} do not hold whole groups of {group} values of K (fp8's group_size); "
                "load them with method= another format (int8, int8g, int4, bf16) to re-quantize"
            )
        scale = np.ascontiguousarray(np.repeat(per_group, bn, axis=0)[:N], dtype=np.float32)
        return Quantized(self.codes.view(ml_dtypes.float8_e4m3fn), scale)


@dataclass(frozen=True)
class Int4Groups:
    """Symmetric INT4 weights ``[N, K]`` as a checkpoint stores them: ``codes`` uint8
    ``[N, ceil(K / group) * group / 2]``, ``q + 8`` for q in [-8, 7], two a byte (even k low,
    zero codes, 8, past K), and the ``scale`` of each row's group ``[N, ceil(K / group)]`` in
    the file's dtype (bfloat16, float16 or float32): ``w = (q - zero) * scale``, with asymmetric
    schemes' integer ``zero`` points ``[N, ceil(K / group)]`` (None: symmetric, zero 0)."""

    codes: Array
    scale: Array
    group: int
    K: int
    zero: Array | None = None
    order: Array | None = None  # GPTQ act-order: column j of ``codes`` is input order[j]

    def to_float32(self) -> Array:
        """The weights [N, K], in input order."""
        q = np.stack([self.codes & 0x0F, self.codes >> 4], axis=-1).reshape(self.codes.shape[0], -1)
        values = (q.astype(np.float32) - 8).reshape(q.shape[0], -1, self.group)
        if self.zero is not None:
            values -= self.zero.astype(np.float32)[..., None]
        dense = (values * self.scale.astype(np.float32)[..., None]).reshape(q.shape[0], -1)[:, : self.K]
        if self.order is None:
            return dense
        ordered = np.empty_like(dense)
        ordered[:, self.order] = dense
        return ordered

    def as_int4z(self) -> Quantized:
        """int4z's portable layout, bit for bit: the stored codes (q + 8), the scales widened to
        float32 (exactly), zero points + 8 (8 where the scheme is symmetric)."""
        zero = np.full(self.scale.shape, 8, np.uint8) if self.zero is None else (self.zero + 8).astype(np.uint8)
        scale = np.ascontiguousarray(self.scale, dtype=np.float32)
        return Quantized(np.ascontiguousarray(self.codes), scale, zero, self.order)

    def why_not_int4(self, group_size: int) -> str | None:
        """Why int4 at ``group_size`` cannot hold these values exactly; None when it can."""
        import ml_dtypes

        if self.zero is not None:
            return "it has zero points (an asymmetric scheme); int4 is symmetric"
        if self.order is not None:
            return "its groups are act-order (GPTQ desc_act); int4 takes contiguous groups"
        if self.group != group_size:
            return f"the checkpoint's groups are {self.group} values of K, not {group_size}"
        if self.group not in formats.by_name("int4").group_sizes:
            return f"int4 takes groups of {formats.spoken_list(formats.by_name('int4').group_sizes)}"
        wide = self.scale.astype(np.float32)
        if not np.array_equal(wide.astype(ml_dtypes.bfloat16).astype(np.float32), wide):
            return f"its {self.scale.dtype} scales are not all exact in bfloat16 (int4's scale type)"
        return None

    def as_int4(self) -> Quantized:
        """int4's portable layout, bit for bit (where :meth:`why_not_int4` finds nothing)."""
        import ml_dtypes

        scale = np.ascontiguousarray(self.scale.astype(np.float32).astype(ml_dtypes.bfloat16))
        return Quantized(np.ascontiguousarray(self.codes), scale)


@dataclass(frozen=True)
class Mxfp4Groups:
    """MXFP4 weights ``[N, K]`` as a checkpoint stores them: ``codes`` uint8 ``[N, ceil(K / 32) *
    16]``, two E2M1 codes a byte (even k low), and E8M0 ``scale`` codes uint8 ``[N, ceil(K / 32)]``:
    mxfp4's portable layout (gpt-oss's ``*_blocks`` and ``*_scales``, compressed-tensors'
    ``mxfp4-pack-quantized``)."""

    codes: Array
    scale: Array
    K: int

    KIND: ClassVar[tuple[str, str]] = ("MXFP4", "fp4")  # the format's name, the element serving it

    def to_float32(self) -> Array:
        return dequantize(Quantized(self.codes, self.scale), "mxfp4", self.K)

    def as_mxfp4(self) -> Quantized:
        return Quantized(self.codes, self.scale)

    def portable(self) -> Quantized:
        return self.as_mxfp4()


def ue4m3_values(codes: Array) -> Array:
    """UE4M3 codes (FP8 E4M3 without its sign bit: NVFP4's group scales) as float32, exactly."""
    exponent, mantissa = (codes >> 3) & 0xF, (codes & 7).astype(np.float32)
    normal = (8 + mantissa) * np.exp2(exponent.astype(np.float32) - 10)
    values: Array = np.where(exponent == 0, mantissa * np.float32(2.0**-9), normal).astype(np.float32)
    return values


@dataclass(frozen=True)
class Nvfp4Groups:
    """NVFP4 weights ``[N, K]`` as a checkpoint stores them: ``codes`` uint8 ``[N, ceil(K / 16) *
    8]``, two E2M1 codes a byte (even k low), ``scale`` uint8 ``[N, ceil(K / 16)]`` UE4M3 codes, and
    ``global_scale`` float32 ``[N]``, the tensor's scale for each row (ModelOpt's ``weight_scale_2``;
    compressed-tensors' ``1 / weight_global_scale``): nvfp4's portable layout."""

    codes: Array
    scale: Array
    global_scale: Array
    K: int

    KIND: ClassVar[tuple[str, str]] = ("NVFP4", "nvfp4")

    def to_float32(self) -> Array:
        return dequantize(self.portable(), "nvfp4", self.K)

    def portable(self) -> Quantized:
        return Quantized(self.codes, self.scale, global_scale=self.global_scale)


@dataclass(frozen=True)
class Mxfp8Groups:
    """MXFP8 weights ``[N, K]`` as a checkpoint stores them: E4M3 ``codes`` uint8 ``[N, K]`` and an
    E8M0 ``scale`` code uint8 ``[N, ceil(K / 32)]`` for each row's 32 values: mxfp8's portable layout."""

    codes: Array
    scale: Array
    K: int

    KIND: ClassVar[tuple[str, str]] = ("MXFP8", "mxfp8")

    def to_float32(self) -> Array:
        return dequantize(self.portable(), "mxfp8", self.K)

    def portable(self) -> Quantized:
        import ml_dtypes

        return Quantized(self.codes.view(ml_dtypes.float8_e4m3fn), self.scale)


# What a checkpoint's expert projection reads as: float weights, or a quantized format as stored
Stored = Array | Fp8Blocks | Int4Groups | Mxfp4Groups | Nvfp4Groups | Mxfp8Groups


def stored_rows(w: Stored, pick: Any) -> Array:
    """Rows ``pick(N)`` of a stored projection of N rows as float32 ``[rows, K]``, dequantizing those
    rows only (each keeps its own scales: an FP8 row its block's, as a block of one row)."""
    from dataclasses import replace

    rows = pick(w.shape[0] if isinstance(w, np.ndarray) else w.codes.shape[0])

    if isinstance(w, Fp8Blocks):
        return Fp8Blocks(w.codes[rows], w.scale[[r // w.block[0] for r in rows]], (1, w.block[1])).to_float32()
    if isinstance(w, Int4Groups):
        return replace(
            w, codes=w.codes[rows], scale=w.scale[rows], zero=None if w.zero is None else w.zero[rows]
        ).to_float32()
    if isinstance(w, Mxfp4Groups):
        return Mxfp4Groups(w.codes[rows], w.scale[rows], w.K).to_float32()
    if isinstance(w, Nvfp4Groups):
        return Nvfp4Groups(w.codes[rows], w.scale[rows], w.global_scale[rows], w.K).to_float32()
    if isinstance(w, Mxfp8Groups):
        return Mxfp8Groups(w.codes[rows], w.scale[rows], w.K).to_float32()
    return np.asarray(w[rows], dtype=np.float32)


def quantize(w: Stored, method: str, group_size: int = 128, *, exact: bool = False) -> Quantized:
    """Quantizes weights ``[..., N, K]`` given as float32 or bfloat16 (others are widened to
    float32 first), FP8 blocks (de-quantized row by row on the way), a checkpoint's INT4 (repacked
    as it is for int4z at its own group size, and for int4 where its scales are exact in bfloat16
    and it has no zero points or act-order) or its MXFP4 (repacked for mxfp4); a stored format
    another method takes is de-quantized first, or with ``exact`` refused with a ValueError saying
    why. NaN or infinity raises ValueError."""
    import ml_dtypes

    import ktforge._native as _native

    element = formats.by_name(method).element
    formats.check_group(method, group_size)
    if isinstance(w, Mxfp4Groups | Nvfp4Groups | Mxfp8Groups):  # the microscaling formats, each its own
        kind, served_as = w.KIND
        if element == served_as:
            return w.portable()
        if exact:
            raise ValueError(f"the checkpoint's {kind} is served as method {kind.lower()}, not {method}")
        w = w.to_float32()
    if isinstance(w, Int4Groups):
        if element == "int4z" and w.group == group_size:
            return w.as_int4z()
        why_not = w.why_not_int4(group_size) if element == "int4" else f"{method} is not int4"
        if why_not is None:
            return w.as_int4()
        if exact:
            raise ValueError(
                f"the checkpoint's INT4 cannot be served as it is: {why_not}; pass method= (int4 with a "
                "group_size, int8g, int8 or bf16) to re-quantize its de-quantized values"
            )
        w = w.to_float32()
    if element == "fp8":
        if not isinstance(w, Fp8Blocks):
            raise ValueError(
                "fp8 takes the FP8 weights of a checkpoint as they are; float weights are packed to fp8 by "
                "MoE.load_weights (kt convert writes int8, int8g, int4, mxfp4 or bf16)"
            )
        return w.per_row(group_size)
    if isinstance(w, Fp8Blocks):
        if element not in ("bf16", "nvfp4", "mxfp8") and element not in LATTICE_BLOCK_BYTES:
            q, scale = _native.quantize_weights(w.codes, method, group_size, w.scale, *w.block)
            return Quantized(q, _scale_dtype(scale, method))
        w = w.to_float32()
    bf16 = np.dtype(ml_dtypes.bfloat16)
    w = np.asarray(w)
    w = np.ascontiguousarray(w if w.dtype in (np.float32, bf16) else w.astype(np.float32))
    if element == "bf16":
        if w.dtype == bf16:
            if ((w.view(np.uint16) & 0x7F80) == 0x7F80).any():  # exponent all ones: NaN or inf
                raise ValueError("weights contain NaN or infinite values")
            return Quantized(w, None)
        if not np.isfinite(w).all():
            raise ValueError("weights contain NaN or infinite values")
        bits = w.view(np.uint32)  # round to nearest even, as the kernels' f32_to_bf16
        rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(
            np.uint16
        )
        return Quantized(rounded.view(bf16), None)
    quantized = _native.quantize_weights(w.view(np.uint16) if w.dtype == bf16 else w, method, group_size)
    if element == "nvfp4":  # the codes, the UE4M3 codes, each row's tensor scale
        return Quantized(quantized[0], quantized[1], global_scale=quantized[2])
    if element == "mxfp8":  # E4M3 codes, an E8M0 code a group
        return Quantized(quantized[0].view(ml_dtypes.float8_e4m3fn), quantized[1])
    return Quantized(quantized[0], _scale_dtype(quantized[1], method))


def _scale_dtype(scale: Array, method: str) -> Array:
    """The extension returns bfloat16 scales (the format table's scale type) as their uint16 bits."""
    import ml_dtypes

    f = formats.by_name(method)
    if f.element in LATTICE_BLOCK_BYTES:  # the blocks' d
        return scale.view(np.float16)
    return scale.view(ml_dtypes.bfloat16) if f.scale is not None and f.scale.type == "bf16" else scale


def dequantize(q: Quantized, method: str, K: int) -> Array:
    """The float32 weights ``[..., N, K]`` a quantized projection stands for."""
    element = formats.by_name(method).element
    if element in ("bf16", "f16", "f32"):
        return np.asarray(q.weight, dtype=np.float32)
    assert q.scale is not None
    if element == "int8":
        return q.weight.astype(np.float32) * q.scale[..., None]
    if element == "mxfp8":  # E4M3 times 2^(e - 127): exact in float32
        import ml_dtypes

        e4m3 = np.asarray(q.weight).view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        scale = np.ldexp(np.float32(1), q.scale.astype(np.int32) - 127).astype(np.float32)
        per_value = np.repeat(scale, 32, axis=-1)[..., :K]
        mx: Array = e4m3 * per_value
        return mx
    if element in ("int8g", "int8h", "fp8"):
        # the group is the size whose count over K the scales have (any, when there is one group)
        groups = q.scale.shape[-1]
        group = next(g for g in formats.by_name(method).group_sizes if -(-K // g) == groups)
        per_value = np.repeat(q.scale.astype(np.float32), group, axis=-1)[..., :K]
        return q.weight.astype(np.float32) * per_value
    if element in ("q6k", "q3k"):
        scale = q6k_group_scales(q.scale)
        values = q.weight.astype(np.float32).reshape(*scale.shape, -1) - (32 if element == "q6k" else 4)
        signed: Array = (values * scale[..., None]).reshape(q.weight.shape)[..., :K]
        return signed
    if element in LEGACY:
        offset, with_min = LEGACY[element]
        codes = q.weight if element in ("q50", "q51") else np.stack([q.weight & 0x0F, q.weight >> 4], axis=-1)
        codes = codes.reshape(*q.weight.shape[:-1], -1, 32).astype(np.float32)
        halves = q.scale.astype(np.float32)
        if with_min:  # as gguf-py's float32: d * q + m
            legacy: Array = halves[..., 0:1] * codes + halves[..., 1:2]
        else:
            legacy = halves[..., None] * (codes - offset)
        return legacy.reshape(*q.weight.shape[:-1], -1)[..., :K]
    if element == "q2k":
        scale, minimum = q2k_group_scales(q.scale)
        two = q.weight.astype(np.float32).reshape(*scale.shape, -1) * scale[..., None] - minimum[..., None]
        low: Array = two.reshape(q.weight.shape)[..., :K]
        return low
    if element in LATTICE_BLOCK_BYTES:
        return lattice_values(element, q.weight, q.scale)[..., :K]
    codes = q.weight if element == "q5k" else np.stack([q.weight & 0x0F, q.weight >> 4], axis=-1)
    codes = codes.reshape(*q.weight.shape[:-1], -1)
    if element == "iq4xs":
        scale = q6k_group_scales(q.scale)  # d, then one int8 scale a group, as q6_k's
        grid: Array = (IQ4_VALUES[codes].reshape(*scale.shape, -1) * scale[..., None]).reshape(codes.shape)[..., :K]
        return grid
    if element in ("q4k", "q5k"):
        scale, minimum = q4k_group_scales(q.scale)
        grouped = codes.astype(np.float32).reshape(*scale.shape, -1) * scale[..., None] - minimum[..., None]
        dense: Array = grouped.reshape(codes.shape)[..., :K]
        return dense
    groups = q.scale.shape[-1]
    if element == "iq4nl":
        values, scale = IQ4_VALUES[codes], q.scale.astype(np.float32)
    elif element == "fp4":
        values = FP4_VALUES[codes]
        scale = np.ldexp(np.float32(1), q.scale.astype(np.int32) - 127).astype(np.float32)
    elif element == "nvfp4":  # code times UE4M3 exactly, then times the tensor's scale
        assert q.global_scale is not None
        exact = FP4_VALUES[codes].reshape(*codes.shape[:-1], groups, -1) * ue4m3_values(q.scale)[..., None]
        scaled: Array = exact.reshape(codes.shape) * q.global_scale.astype(np.float32)[..., None]
        return scaled[..., :K]
    elif element == "int4z":
        assert q.zero is not None
        values = (codes.astype(np.float32).reshape(*codes.shape[:-1], groups, -1) - q.zero[..., None]).reshape(
            codes.shape
        )
        scale = q.scale.astype(np.float32)
    else:
        values, scale = codes.astype(np.float32) - 8, q.scale.astype(np.float32)
    grouped = values.reshape(*values.shape[:-1], groups, -1) * scale[..., None]
    result: Array = grouped.reshape(values.shape)[..., :K]
    return result


Q4K_RECORD = 20  # bytes of q4_k's portable record: d, dmin (float16), sc[8], m[8]


def q4k_group_scales(records: Array) -> tuple[Array, Array]:
    """q4_k's records ``[..., S, 20]`` -> each group's scale d * sc and min dmin * m, float32
    ``[..., S * 8]`` (exact: 11 + 6 significant bits)."""
    halves = np.ascontiguousarray(records[..., :4]).view("<f2").astype(np.float32)  # [..., S, 2]
    sc, m = records[..., 4:12].astype(np.float32), records[..., 12:20].astype(np.float32)
    scale = (halves[..., 0:1] * sc).reshape(*records.shape[:-2], -1)
    minimum = (halves[..., 1:2] * m).reshape(*records.shape[:-2], -1)
    return scale, minimum


# GGUF's Q4_0, Q4_1, Q5_0, Q5_1 (elements q40, q41, q50, q51): the codes' offset, and whether a
# float16 m beside each d is added
LEGACY = {"q40": (8, False), "q41": (0, True), "q50": (16, False), "q51": (0, True)}
Q2K_RECORD = 20  # q2_k's: d, dmin (float16), then a byte a group of 16: sc (low nibble), m (high)


def q2k_group_scales(records: Array) -> tuple[Array, Array]:
    """q2_k's records ``[..., S, 20]`` -> each group's scale d * sc and min dmin * m, float32
    ``[..., S * 16]`` (exact)."""
    halves = np.ascontiguousarray(records[..., :4]).view("<f2").astype(np.float32)  # [..., S, 2]
    scm = records[..., 4:20]
    scale = (halves[..., 0:1] * (scm & 0x0F).astype(np.float32)).reshape(*records.shape[:-2], -1)
    minimum = (halves[..., 1:2] * (scm >> 4).astype(np.float32)).reshape(*records.shape[:-2], -1)
    return scale, minimum


Q6K_RECORD = (
    18  # bytes of q6_k's portable record: d (float16), sc[16] (int8)  (q3_k's too: sc the file's 6-bit scale less 32)
)
IQ4XS_RECORD = 10  # iq4_xs's: d (float16), sc[8] (int8)


def q6k_group_scales(records: Array) -> Array:
    """q6_k's records ``[..., S, 18]`` (iq4_xs's ``[..., S, 10]``) -> each group's scale d * sc,
    float32 ``[..., S * 16]`` (``S * 8``; exact: 11 + 8 significant bits)."""
    d = np.ascontiguousarray(records[..., :2]).view("<f2").astype(np.float32)  # [..., S, 1]
    sc = np.ascontiguousarray(records[..., 2:]).view(np.int8).astype(np.float32)
    scale: Array = (d * sc).reshape(*records.shape[:-2], -1)
    return scale


def shapes(method: str, N: int, K: int, group_size: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Per-expert shape and safetensors dtype of ``weight``, ``scale`` (and ``zero``) for one projection."""
    f = formats.by_name(method)
    weight, scale = f.checkpoint.weight_dtype, f.checkpoint.scale_dtype
    if f.element in ("bf16", "f16", "f32"):
        return {"weight": ((N, K), weight)}
    if f.element == "int8":
        return {"weight": ((N, K), weight), "scale": ((N,), scale or "F32")}
    if f.element in LATTICE_BLOCK_BYTES:  # the blocks less d, and the d
        supers = -(-K // 256)
        return {
            "weight": ((N, supers * (LATTICE_BLOCK_BYTES[f.element] - 2)), weight),
            "scale": ((N, supers), scale or "F16"),
        }
    if f.super_block is not None:
        supers = -(-K // f.super_block.values)
        per_byte = 2 if f.element in ("q4k", "iq4xs") else 1  # the others' codes a byte each
        record = {"q6k": Q6K_RECORD, "q3k": Q6K_RECORD, "q2k": Q2K_RECORD, "iq4xs": IQ4XS_RECORD}.get(
            f.element, Q4K_RECORD
        )
        return {
            "weight": ((N, supers * f.super_block.values // per_byte), weight),
            "scale": ((N, supers, record), scale or "U8"),
        }
    groups = -(-K // group_size)
    if f.element in LEGACY:
        with_min = LEGACY[f.element][1]
        return {
            "weight": ((N, groups * group_size // (1 if f.bits == 5 else 2)), weight),
            "scale": ((N, groups, 2) if with_min else (N, groups), scale or "F16"),
        }
    if f.element in ("int8g", "int8h", "fp8", "mxfp8"):
        return {"weight": ((N, K), weight), "scale": ((N, groups), scale or "F32")}
    if f.element == "nvfp4":
        return {
            "weight": ((N, groups * group_size // 2), weight),
            "scale": ((N, groups), scale or "U8"),
            "global_scale": ((N,), "F32"),
        }
    parts: dict[str, tuple[tuple[int, ...], str]] = {
        "weight": ((N, groups * group_size // 2), weight),
        "scale": ((N, groups), scale or "F32"),
    }
    if f.zero_point is not None:
        parts["zero"] = ((N, groups), "U8")
    return parts
