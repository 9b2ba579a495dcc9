"""Golden MXFP8 cases with bytes derived by hand from the OCP MX v1.0 rules (not by running the code).

Notation. E4M3 byte = s.EEEE.MMM: normal value (1 + M/8) * 2**(E - 7), denormal
(E = 0) M * 2**-9; 1.0 = 0x38, 0.5 = 0x30, 2**-6 = 0x08 (smallest normal),
2**-9 = 0x01, 256 = 0x78, 448 = 0x7E (largest), S.1111.111 = NaN (0x7F).
E8M0 byte = e + 127 for a scale 2**e; 0xFF = NaN.
Scale rules (kernels/mx.py): FLOOR e = floor(log2 amax) - 8;
RCEIL e = ceil(log2(amax / 448)); both clamped to [-127, 127].
Each case is one 32-block: ``values`` followed by +0.0 up to 32 elements
(unless ``fill`` is False: then the input is just ``values`` and the
quantiser pads). Expected element bytes are listed for ``values``; the filler
encodes as 0x00. A NaN-scale block (``NAN``) expects 0x7F in all 32 bytes.

``torchao`` names, per scale mode, why torchao 0.18's ``MXTensor.to_mx``
gives other bytes on that case (reasons in ``TORCHAO_REASONS``); those cases
are expected failures of the agreement test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

INF = float("inf")
NAN = None  # expected data of a NaN-scale block: every byte 0x7F
FLT_MAX = (2 - 2**-23) * 2.0**127

TORCHAO_REASONS = {
    "inf": "torchao gives an Inf block a finite scale (FLOOR 2**120, RCEIL byte 254) and saturates Inf to 448; "
    "the spec's floor(log2(Inf)) overflows E8M0, so the scale is NaN (as in microsoft/microxcaling)",
    "nan_data": "same NaN scale, but torchao FLOOR quantises the block's other elements with scale 2**120 "
    "instead of making every element NaN (the bytes differ; both dequantise to all-NaN)",
    "min_scale_floor": "scale byte 0 (2**-127): torchao divides by 2**-126 (it clamps the float scale to the "
    "smallest normal float32), so its elements are half of what the recorded scale says",
    "min_scale_rceil": "scale byte 0 (2**-127): torchao multiplies by 1.0 instead of 2**127 "
    "(TransformerEngine's exp2f_rcp special case), flushing the block to zero",
    "rceil_log2": "torchao's eager RCEIL takes ceil(float32 log2(amax/448)); log2 of 2**k * (1 + 2**-23) "
    "rounds to exactly k (for every k outside [-4, 3]), so it keeps 2**k and saturates where the exact rule picks 2**(k+1)",
}


@dataclass(frozen=True)
class Golden:
    name: str
    values: tuple[float, ...]
    floor: tuple[int, tuple[int, ...] | None]  # (scale byte, element bytes or NAN)
    rceil: tuple[int, tuple[int, ...] | None]
    fill: bool = True
    torchao: dict[str, str] = field(default_factory=dict)  # mode -> key of TORCHAO_REASONS


CASES: tuple[Golden, ...] = (
    # amax 0: log2 is -inf, clamped to the minimum scale 2**-127 (byte 0)
    Golden("zeros", (0.0,), (0, (0x00,)), (0, (0x00,))),
    # -0.0 keeps its sign bit: 0x80
    Golden("signed_zero", (-0.0, 0.0), (0, (0x80, 0x00)), (0, (0x80, 0x00))),
    # amax 448 = 1.75 * 2**8: FLOOR e = 8 - 8 = 0; RCEIL 448/448 = 1 -> e = 0. Elements unchanged.
    Golden("max_normal", (448.0, -448.0, 1.0), (127, (0x7E, 0xFE, 0x38)), (127, (0x7E, 0xFE, 0x38))),
    # 464 = 1.8125 * 2**8. FLOOR e = 0: 464 is the tie between 448 (M=6, even) and 480 (M=7) -> 448.
    # RCEIL 464/448 > 1 -> e = 1: 232 is the tie between 224 (M=6) and 240 (M=7) -> 224 = 0x76; 1/2 = 0x30.
    Golden("tie_464", (464.0, 1.0), (127, (0x7E, 0x38)), (128, (0x76, 0x30))),
    # 480 would be S.1111.111 = NaN: FLOOR (e = 0) saturates to 448. RCEIL e = 1: 240 = 1.875 * 2**7 = 0x77.
    Golden("over_480", (480.0, 1.0), (127, (0x7E, 0x38)), (128, (0x77, 0x30))),
    # the float after 448 (448 + 2**-15): FLOOR e = 0, rounds to 448. RCEIL: just over 448 -> e = 1, 224 = 0x76.
    Golden("above_448", (448.0 + 2**-15, 1.0), (127, (0x7E, 0x38)), (128, (0x76, 0x30))),
    # the float before 512: FLOOR e = 0, saturates. RCEIL e = 1: 255.99998 rounds up to 256 = 0x78 (carry).
    Golden("below_512", (512.0 - 2**-15,), (127, (0x7E,)), (128, (0x78,))),
    # FLT_MAX = 1.99999988 * 2**127. FLOOR e = 127 - 8 = 119 (byte 246): 511.99997 saturates; 1.0 / 2**119 -> 0.
    # RCEIL: mantissa > 1.75 -> e = 120 (byte 247): 255.99998 rounds to 256 = 0x78.
    Golden("flt_max", (FLT_MAX, -FLT_MAX, 1.0), (246, (0x7E, 0xFE, 0x00)), (247, (0x78, 0xF8, 0x00))),
    # Inf: floor(log2(Inf)) exceeds E8M0 -> X = NaN; the block is NaN
    Golden("pos_inf", (INF, 1.0), (255, NAN), (255, NAN), torchao={"floor": "inf", "rceil": "inf"}),
    Golden("neg_inf", (1.0, -INF), (255, NAN), (255, NAN), torchao={"floor": "inf", "rceil": "inf"}),
    # a NaN element makes X = NaN
    Golden("nan", (1.0, float("nan")), (255, NAN), (255, NAN), torchao={"floor": "nan_data"}),
    Golden("neg_nan", (-float("nan"), -2.0), (255, NAN), (255, NAN), torchao={"floor": "nan_data"}),
    # E4M3 rounding boundaries with the scale pinned to 1 by 448 (both modes e = 0):
    # 1.0625 tie 1.0|1.125 -> 1.0 (0x38); 1.1875 tie 1.125|1.25 -> 1.25 (0x3A); 1.0625+2**-20 -> 1.125 (0x39);
    # 17 tie 16|18 -> 16 (0x58); 19 tie 18|20 -> 20 (0x5A); -17 -> 0xD8; 248 tie 240 (M=7)|256 -> 256 (0x78);
    # 2**-10 tie 0|2**-9 -> 0; 2**-10 + 2**-20 -> 2**-9 (0x01); 3*2**-10 tie 1|2 quanta -> 2 (0x02);
    # 2**-9 = 0x01; 7*2**-9 = 0x07 (largest denormal); 15*2**-10 tie 7 quanta|2**-6 -> 2**-6 (0x08);
    # 2**-6 = 0x08; -2**-11 rounds to -0 (0x80).
    Golden(
        "e4m3_ties",
        (448.0, 1.0625, 1.1875, 1.0625 + 2**-20, 17.0, 19.0, -17.0, 248.0, 2**-10, 2**-10 + 2**-20,
         3 * 2**-10, 2**-9, 7 * 2**-9, 15 * 2**-10, 2**-6, -(2**-11)),  # fmt: skip
        (127, (0x7E, 0x38, 0x3A, 0x39, 0x58, 0x5A, 0xD8, 0x78, 0x00, 0x01, 0x02, 0x01, 0x07, 0x08, 0x08, 0x80)),
        (127, (0x7E, 0x38, 0x3A, 0x39, 0x58, 0x5A, 0xD8, 0x78, 0x00, 0x01, 0x02, 0x01, 0x07, 0x08, 0x08, 0x80)),
    ),
    # float32 denormals: amax 1.5 * 2**-127 has exponent field 0 -> both modes clamp to e = -127 (byte 0).
    # x * 2**127: 1.5 = 0x3C, 1.0 = 0x38, 2**-149 -> 2**-22 -> 0, -2**-130 -> -0.125 = 0xA0.
    Golden("f32_denormals", (1.5 * 2**-127, 2**-127, 2**-149, -(2**-130)), (0, (0x3C, 0x38, 0x00, 0xA0)),
           (0, (0x3C, 0x38, 0x00, 0xA0)), torchao={"floor": "min_scale_floor", "rceil": "min_scale_rceil"}),  # fmt: skip
    # bfloat16 denormals (quantum 2**-133), exact in float32 too: amax 1.5 * 2**-127 -> byte 0 in both modes;
    # x * 2**127: 1.5 = 0x3C, 2**-6 = 0x08 (smallest normal), -0.125 = 0xA0.
    Golden("bf16_denormals", (1.5 * 2**-127, 2**-133, -(2**-130)), (0, (0x3C, 0x08, 0xA0)), (0, (0x3C, 0x08, 0xA0)),
           torchao={"floor": "min_scale_floor", "rceil": "min_scale_rceil"}),  # fmt: skip
    # amax 1.5 * 2**-119 (< 2**-118): FLOOR e = -119 - 8 = -127; RCEIL ceil(log2(amax/448)) = -127 -> byte 0.
    # 1.5 * 2**8 = 384 = 1.5 * 2**8 -> E=15, M=4 = 0x7C.
    Golden("amax_below_2^-118", (1.5 * 2**-119,), (0, (0x7C,)), (0, (0x7C,)),
           torchao={"floor": "min_scale_floor", "rceil": "min_scale_rceil"}),  # fmt: skip
    # amax 2**-119: FLOOR e = -127 exactly; RCEIL ceil(-119 - 8.81) = -127. 2**8 = 0x78.
    Golden("amax_2^-119", (2**-119,), (0, (0x78,)), (0, (0x78,)),
           torchao={"floor": "min_scale_floor", "rceil": "min_scale_rceil"}),  # fmt: skip
    # amax 2**-120 (FLOOR would want e = -128): clamped to -127. 2**7 = 0x70, 2**2 = 0x48, -2**-3 = 0xA0.
    Golden("tiny_block", (2**-120, 2**-125, -(2**-130)), (0, (0x70, 0x48, 0xA0)), (0, (0x70, 0x48, 0xA0)),
           torchao={"floor": "min_scale_floor", "rceil": "min_scale_rceil"}),  # fmt: skip
    # amax 1.875 * 2**-119, between 448 * 2**-127 and 2**-118: FLOOR e = -119 - 8 = -127 (byte 0), 480 saturates
    # to 448 (0x7E). RCEIL amax/448 = 1.07 * 2**-127 -> e = -126 (byte 1): 1.875 * 2**7 = 240 = 0x77.
    Golden("floor_only_min_scale", (1.875 * 2**-119,), (0, (0x7E,)), (1, (0x77,)),
           torchao={"floor": "min_scale_floor"}),  # fmt: skip
    # amax 2**-118: FLOOR e = -126 (byte 1); RCEIL 2**-118/448 in (2**-127, 2**-126] -> e = -126. 2**8 = 0x78.
    Golden("amax_2^-118", (2**-118,), (1, (0x78,)), (1, (0x78,))),
    # amax = the float after 448 * 2**-20: FLOOR e = -12 - 8 = -20 (byte 107), element rounds to 448;
    # RCEIL just over 448 * 2**-20 -> e = -19 (byte 108): 224 = 0x76, 2**-20 / 2**-19 = 0.5 = 0x30.
    Golden("rceil_boundary", ((1.75 + 2**-23) * 2**-12, 2**-20), (107, (0x7E, 0x38)), (108, (0x76, 0x30)),
           torchao={"rceil": "rceil_log2"}),  # fmt: skip
    # amax 1000 = 1.95 * 2**9. FLOOR e = 1 (byte 128): 500 -> 448 (0x7E), 0.5 (0x30), 0.005 = 2.56 quanta -> 3
    # (0x03), -1.65 -> -1.625 (0xBD). RCEIL 1.95 > 1.75 -> e = 2 (byte 129): 250 -> 256 (0x78), 0.25 (0x28),
    # 0.0025 = 1.28 quanta -> 1 (0x01), -0.825 -> -0.8125 (0xB5).
    Golden("mixed", (1000.0, 1.0, 0.01, -3.3), (128, (0x7E, 0x30, 0x03, 0xBD)), (129, (0x78, 0x28, 0x01, 0xB5))),
    # length 5 (the quantiser pads to 32): amax 3.5 = 1.75 * 2**1 -> both e = -7 (byte 120);
    # x * 2**7: 256 (0x78), -128 (0xF0), 96 = 1.5 * 2**6 (0x6C), 0, 448 (0x7E).
    Golden("padding", (2.0, -1.0, 0.75, 0.0, 3.5), (120, (0x78, 0xF0, 0x6C, 0x00, 0x7E)),
           (120, (0x78, 0xF0, 0x6C, 0x00, 0x7E)), fill=False),  # fmt: skip
)


def exact_in(case: Golden, dtype: torch.dtype) -> bool:
    """Whether every value of ``case`` survives conversion to ``dtype`` unchanged (NaN counts as unchanged)."""
    x32 = torch.tensor(block(case), dtype=torch.float32)
    back = x32.to(dtype).float()
    return bool(((back == x32) | (x32.isnan() & back.isnan())).all())


def params(dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)) -> list[tuple[Golden, torch.dtype]]:
    """(case, dtype) pairs where the case is exact in the dtype: the golden table per input dtype."""
    return [(c, d) for d in dtypes for c in CASES if exact_in(c, d)]


def block(case: Golden) -> list[float]:
    """The input values of ``case``."""
    if not case.fill:
        return list(case.values)
    return list(case.values) + [0.0] * (32 - len(case.values))


def expected(case: Golden, mode: str) -> tuple[int, list[int]]:
    """(scale byte, all 32 element bytes) expected for ``case`` in ``mode``."""
    scale, elems = case.floor if mode == "floor" else case.rceil
    if elems is None:
        return scale, [0x7F] * 32
    return scale, list(elems) + [0x00] * (32 - len(elems))
