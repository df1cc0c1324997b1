"""Self-checks of the NumPy reference (twinengine.testing.reference) against ml_dtypes,
published test vectors and hand-worked edge cases.  No twinengine import."""


import ml_dtypes
import numpy as np
import pytest

from twinengine.testing.reference import (
    FLT_MAX,
    BF16_MAX,
    FP16_MAX,
    _e2m1_stochastic,
    amax_ref,
    cast_e2m1_ref,
    cast_fp8_ref,
    decode_e2m1_ref,
    decode_fp8_ref,
    delayed_scaling_update_ref,
    dequantize_fp8_block_ref,
    dequantize_fp8_ref,
    dequantize_mxfp8_ref,
    dequantize_nvfp4_ref,
    e8m0_from_block_amax_ref,
    e8m0_multiplier_ref,
    e8m0_to_float_ref,
    pack_e2m1_ref,
    philox4x32_10_ref,
    quantize_fp8_block_ref,
    quantize_fp8_current_ref,
    quantize_fp8_delayed_ref,
    quantize_mxfp8_ref,
    quantize_nvfp4_ref,
    rht_matrix_ref,
    rht_ref,
    round_to_dtype_ref,
    scale_from_amax_ref,
    sr_random_bytes_ref,
    unpack_e2m1_ref,
)

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
MAXV = {"e4m3": 448.0, "e5m2": 57344.0}
f32 = np.float32

# The reference suppresses numpy's overflow/invalid warnings internally; any leak is a bug.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


def _same_float(a, b):
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    return np.array_equal(a.view(np.uint32), b.view(np.uint32)) or (
        np.array_equal(np.isnan(a), np.isnan(b))
        and np.array_equal(a[~np.isnan(a)].view(np.uint32), b[~np.isnan(b)].view(np.uint32))
    )


# ------------------------------------------------------------------------- FP8 casts


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_decode_fp8_matches_ml_dtypes_all_codes(fmt):
    codes = np.arange(256, dtype=np.uint8)
    ours = decode_fp8_ref(codes, fmt)
    theirs = codes.view(ML[fmt]).astype(np.float32)
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    ok = ~np.isnan(ours)
    assert np.array_equal(ours[ok].view(np.uint32), theirs[ok].view(np.uint32))  # incl. -0.0
    assert np.isnan(ours).sum() == (2 if fmt == "e4m3" else 6)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cast_fp8_round_trip_all_codes(fmt):
    codes = np.arange(256, dtype=np.uint8)
    vals = decode_fp8_ref(codes, fmt)
    back = cast_fp8_ref(vals, fmt)
    finite = np.isfinite(vals)
    assert np.array_equal(back[finite], codes[finite])
    assert np.all(back[np.isnan(vals)] == 0x7F)
    if fmt == "e5m2":
        assert back[0x7C] == 0x7B and back[0xFC] == 0xFB  # +-inf saturate to +-57344


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cast_fp8_matches_ml_dtypes_in_range(fmt):
    rng = np.random.default_rng(1234)
    m = MAXV[fmt]
    n = 200_000
    # Log-uniform magnitudes across the whole range incl. subnormals and fp32-tiny values.
    mag = np.exp2(rng.uniform(-30, np.log2(m), n)).astype(np.float32)
    v = np.where(rng.random(n) < 0.5, -mag, mag).astype(np.float32)
    v = v[np.abs(v) <= m]
    # All exact midpoints between consecutive positive finite codes (ties) and neighbours.
    grid = decode_fp8_ref(np.arange(0x00, 0x80, dtype=np.uint8), fmt)
    grid = np.sort(grid[np.isfinite(grid)]).astype(np.float64)
    mids = ((grid[:-1] + grid[1:]) / 2).astype(np.float32)  # exact in fp32
    near = np.concatenate([mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf))])
    near = near[near <= m]
    v = np.concatenate([v, near, -near, f32([0.0, -0.0, m, -m])]).astype(np.float32)
    ours = cast_fp8_ref(v, fmt)
    theirs = v.astype(ML[fmt]).view(np.uint8)
    bad = np.nonzero(ours != theirs)[0]
    assert bad.size == 0, f"first mismatch v={v[bad[0]]!r}: {ours[bad[0]]:#x} vs {theirs[bad[0]]:#x}"


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1"])
def test_cast_random_fp32_bit_patterns_match_ml_dtypes(fmt):
    # Uniform random fp32 bit patterns (every exponent, fp32 subnormals) within +-max.
    bits = np.random.default_rng(99).integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    v = bits.view(np.float32)
    m = 6.0 if fmt == "e2m1" else MAXV[fmt]
    v = v[np.isfinite(v) & (np.abs(v) <= m)]
    if fmt == "e2m1":
        ours, theirs = cast_e2m1_ref(v), v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    else:
        ours, theirs = cast_fp8_ref(v, fmt), v.astype(ML[fmt]).view(np.uint8)
    bad = np.nonzero(ours != theirs)[0]
    assert bad.size == 0, f"first mismatch v={v[bad[0]]!r}"


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cast_fp8_saturation_and_nan(fmt):
    m = MAXV[fmt]
    maxc = 0x7E if fmt == "e4m3" else 0x7B
    v = f32([m * 1.01, m * 1000, 3e38, np.inf, FLT_MAX])
    assert np.all(cast_fp8_ref(v, fmt) == maxc)
    assert np.all(cast_fp8_ref(-v, fmt) == (maxc | 0x80))
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], dtype=np.uint32).view(np.float32)
    assert np.all(cast_fp8_ref(nans, fmt) == 0x7F)
    # Negative values rounding to zero keep their sign; tiny fp32 subnormals round to +-0.
    assert cast_fp8_ref(f32([-0.0, -1e-30, 1e-45, -1e-45]), fmt).tolist() == [0x80, 0x80, 0x00, 0x80]


def test_cast_fp8_hand_values():
    # E4M3: 464 is the tie between 448 and 480 (-> even = 448); min subnormal 2^-9.
    assert cast_fp8_ref(f32([464.0, 2.0**-9, 2.0**-10, 1.5 * 2.0**-10, 2.0**-6]), "e4m3").tolist() == [
        0x7E, 0x01, 0x00, 0x01, 0x08]
    # E5M2: min subnormal 2^-16; 61440 (tie 57344/65536) saturates either way.
    assert cast_fp8_ref(f32([61440.0, 2.0**-16, 2.0**-17, 3 * 2.0**-17]), "e5m2").tolist() == [
        0x7B, 0x01, 0x00, 0x02]


# ------------------------------------------------------------------------- E2M1


def test_e2m1_all_codes_match_ml_dtypes():
    codes = np.arange(16, dtype=np.uint8)
    ours = decode_e2m1_ref(codes)
    theirs = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    assert ours[:8].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert np.array_equal(cast_e2m1_ref(ours), codes)  # round trip incl. -0.0 -> 0x8


def test_e2m1_ties_saturation_nan_sign():
    v = f32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    expect = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert decode_e2m1_ref(cast_e2m1_ref(v)).tolist() == expect
    assert decode_e2m1_ref(cast_e2m1_ref(-v)).tolist() == [-e for e in expect]
    assert cast_e2m1_ref(f32([-0.25])).tolist() == [0x8]
    assert cast_e2m1_ref(f32([6.5, 7.0, 1e30, np.inf, -7.0, -np.inf])).tolist() == [7, 7, 7, 7, 15, 15]
    assert cast_e2m1_ref(f32([np.nan, -np.nan])).tolist() == [7, 7]
    assert cast_e2m1_ref(f32([0.0, -0.0, -1e-40, 0.2499])).tolist() == [0, 8, 8, 0]


def test_e2m1_matches_ml_dtypes_in_range():
    rng = np.random.default_rng(7)
    v = rng.uniform(-6, 6, 100_000).astype(np.float32)
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    mids = ((grid[:-1] + grid[1:]) / 2).astype(np.float32)
    v = np.concatenate([v, mids, -mids]).astype(np.float32)
    assert np.array_equal(cast_e2m1_ref(v), v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8))


def test_e2m1_pack_unpack():
    codes = np.array([[1, 2, 3, 4], [15, 0, 8, 7]], dtype=np.uint8)
    packed = pack_e2m1_ref(codes)
    assert packed.tolist() == [[0x21, 0x43], [0x0F, 0x78]]  # even index in the low nibble
    assert np.array_equal(unpack_e2m1_ref(packed), codes)


def test_e2m1_stochastic_rounding_rules():
    # v, random byte k (u = k/256) -> expected value; t = |v| + u*step(|v|), q = floor(t/step(t))*step(t)
    cases = [
        (1.9, 26, 1.5),   # t = 1.9 + 0.1015625*0.5 = 1.95078 -> 1.5
        (1.9, 52, 2.0),   # t = 2.0015625 -> step 1 -> 2
        (0.1, 0, 0.0),
        (0.1, 230, 0.5),  # t = 0.1 + 0.449... = 0.549 -> 0.5
        (5.0, 127, 4.0),  # t = 5 + 0.99 = 5.99 -> floor(2.99)*2 = 4
        (5.0, 128, 6.0),  # t = 6 -> 6
        (100.0, 0, 6.0),
        (3.0, 255, 3.0),
        (-2.5, 128, -3.0),
    ]
    v = f32([c[0] for c in cases])
    k = np.array([c[1] for c in cases], dtype=np.uint8)
    got = decode_e2m1_ref(_e2m1_stochastic(v, k)).tolist()
    assert got == [c[2] for c in cases]
    assert _e2m1_stochastic(f32([np.nan, -0.0]), np.array([3, 3], dtype=np.uint8)).tolist() == [7, 8]


# ------------------------------------------------------------------------- Philox


@pytest.mark.parametrize(
    "ctr,key,expect",
    [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_philox_known_answers(ctr, key, expect):
    out = philox4x32_10_ref([np.array([c], dtype=np.uint32) for c in ctr], key)
    assert tuple(int(o[0]) for o in out) == expect


def test_sr_random_bytes_layout():
    b = sr_random_bytes_ref(40, 1, seed=5, offset=9)
    for g in range(3):
        words = philox4x32_10_ref([np.uint32(g), np.uint32(1), np.uint32(9), np.uint32(0)], (5, 0))
        raw = np.array([int(w) for w in words], dtype="<u4").tobytes()
        n = min(16, 40 - 16 * g)
        assert b[16 * g : 16 * g + n].tolist() == list(raw[:n])


# ------------------------------------------------------------------------- RHT


def test_rht_matrix_orthonormal():
    H = rht_matrix_ref()
    assert H.dtype == np.float32
    assert np.array_equal(H @ H.T, np.eye(16, dtype=np.float32))
    assert np.all(np.abs(H) == 0.25)
    # Column 0 of H16 is all ones, so column 0 of H is the sign vector of mask 0xD7E8 / 4.
    assert [int(H[j, 0] < 0) for j in range(16)] == [(0xD7E8 >> j) & 1 for j in range(16)]


def test_rht_ref_sequential_sum_and_bf16():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 64)).astype(ml_dtypes.bfloat16)
    y = rht_ref(x)
    xf = x.astype(np.float32).reshape(8, 4, 16)
    H = rht_matrix_ref()
    acc = xf[..., 0, None] * H[0]
    for j in range(1, 16):
        acc = (acc + xf[..., j, None] * H[j]).astype(np.float32)
    expect = acc.reshape(8, 64).astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(y, expect)
    # close to the exact transform; applying it twice gives back x (H orthonormal, symmetric up to bf16)
    exact = (xf.astype(np.float64) @ H.astype(np.float64)).reshape(8, 64)
    assert np.allclose(y, exact, rtol=2**-7, atol=1e-30)


# ------------------------------------------------------------------------- §2 scale


def test_scale_from_amax_edges():
    M = f32(448)
    assert scale_from_amax_ref(f32(0), M) == 1
    assert scale_from_amax_ref(f32(np.inf), M) == 1
    assert scale_from_amax_ref(f32(np.nan), M) == 1
    assert scale_from_amax_ref(f32(np.nan), M, eps=1.0) == 1  # NaN stays NaN through max(a, eps)
    assert scale_from_amax_ref(f32(2.0), M) == f32(224)
    assert scale_from_amax_ref(f32(3.0), M) == f32(448) / f32(3)
    assert scale_from_amax_ref(f32(3.0), M, pow2=True) == 128
    assert scale_from_amax_ref(f32(0), M, eps=0.5) == 896
    assert scale_from_amax_ref(f32(0.25), M, eps=0.5) == 896
    assert scale_from_amax_ref(f32(1e-40), M) == FLT_MAX  # subnormal amax: 448/a overflows
    assert scale_from_amax_ref(f32(1e-40), M, pow2=True) == f32(2.0**127)
    assert scale_from_amax_ref(f32(1e-40), M, inf_value=BF16_MAX) == BF16_MAX
    assert scale_from_amax_ref(f32(1e-40), M, pow2=True, inf_value=FP16_MAX) == 32768
    assert scale_from_amax_ref(f32(1e-35), M) == f32(448) / f32(1e-35)  # finite, not replaced
    s = scale_from_amax_ref(f32([0, 2, np.inf]), M)
    assert s.dtype == np.float32 and s.tolist() == [1, 224, 1]
    assert isinstance(scale_from_amax_ref(f32(2), M), np.float32)


# ------------------------------------------------------------------------- §5 E8M0


def test_e8m0_edges():
    M = 448.0
    recip = f32(1) / f32(M)
    assert e8m0_from_block_amax_ref(f32(0), M) == 0
    assert e8m0_from_block_amax_ref(f32(np.inf), M) == 254
    assert e8m0_from_block_amax_ref(f32(np.nan), M) == 255
    assert e8m0_from_block_amax_ref(f32(FLT_MAX), M) == 247  # v ~ 2^119.2 -> rounded up to 2^120
    # v = fl(448 * fl(1/448)): check the round-up rule on its bits
    v = f32(448) * recip
    bits = int(np.array(v).view(np.uint32))
    want = ((bits >> 23) & 0xFF) + (1 if bits & 0x7FFFFF else 0)
    assert e8m0_from_block_amax_ref(f32(448), M) == want
    # E5M2: 57344 * fl(1/57344); a power-of-two amax times a power-of-two reciprocal is exact
    assert e8m0_from_block_amax_ref(f32(2.0**16), 57344.0) != 0
    assert e8m0_from_block_amax_ref(f32([0.0, 2.0**-149, 448 * 2.0**-130]), M).tolist()[0:2] == [0, 0]
    # with M = 1 the reciprocal is exact and v = a
    assert e8m0_from_block_amax_ref(f32([2.0**-127, 2.0**-128, 1.1 * 2.0**-127, 1.0, 1.5, 2.0**127 * 1.5]), 1.0).tolist() == [
        0, 0, 1, 127, 128, 254]


def test_e8m0_decode_and_multiplier():
    e = np.arange(256, dtype=np.uint8)
    vals = e8m0_to_float_ref(e)
    theirs = e.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert _same_float(vals, theirs)
    assert vals[0] == f32(2.0**-127) and vals[254] == f32(2.0**127) and np.isnan(vals[255])
    m = e8m0_multiplier_ref(e[:255])
    assert np.all((m.astype(np.float64) * vals[:255].astype(np.float64)) == 1.0)


# ------------------------------------------------------------------------- §3 delayed


def test_delayed_update_rules():
    H = np.array([[4.0, 0.0, 2.0], [8.0, 5.0, 1.0], [1.0, 7.0, 3.0]], dtype=np.float32)
    s = f32([1.0, 3.0, 1.0])
    nh, ns = delayed_scaling_update_ref(H, s, "e4m3", margin=1, algo="max")
    # column 1 unused (H[0] == 0): unchanged
    assert nh[:, 1].tolist() == [0.0, 5.0, 7.0] and ns[1] == 3.0
    assert nh[:, 0].tolist() == [0.0, 1.0, 4.0] and ns[0] == f32(224) / f32(8)
    assert nh[:, 2].tolist() == [0.0, 3.0, 2.0] and ns[2] == f32(224) / f32(3)
    nh, ns = delayed_scaling_update_ref(H, s, "e5m2", margin=0, algo="most_recent")
    assert ns[0] == f32(57344) / f32(4) and ns[2] == f32(57344) / f32(2)
    # inf amax keeps s; tiny amax overflows to FLT_MAX; L = 1
    nh, ns = delayed_scaling_update_ref(np.array([[np.inf, 1e-40]], dtype=np.float32), f32([2, 2]), "e4m3", 0, "max")
    assert ns.tolist() == [2.0, float(FLT_MAX)] and nh.tolist() == [[0.0, 0.0]]


# ------------------------------------------------------------------------- end to end


def test_amax_nan_skipping():
    assert amax_ref(f32([np.nan, -3.0, 2.0])) == 3
    assert amax_ref(f32([np.nan, np.nan])) == 0
    assert amax_ref(f32([1.0, -np.inf, np.nan])) == np.inf
    assert amax_ref(np.zeros((0, 4), np.float32)) == 0


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_fp8_current_and_delayed_roundtrip(dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 5, 64)) * 10).astype(dtype)
    out = quantize_fp8_current_ref(x, "e4m3")
    assert out["rowwise_data"].shape == x.shape and out["columnwise_data"].shape == (64, 15)
    assert np.array_equal(out["columnwise_data"], out["rowwise_data"].reshape(15, 64).T)
    s_inv = out["rowwise_scale_inv"]
    assert s_inv[0] == f32(1) / (f32(448) / out["amax"][0])
    xh = dequantize_fp8_ref(out["columnwise_data"], s_inv, "e4m3", x.shape, columnwise=True)
    assert np.array_equal(xh, dequantize_fp8_ref(out["rowwise_data"], s_inv, "e4m3", x.shape))
    assert np.allclose(xh, x.astype(np.float32), rtol=2**-3, atol=s_inv[0] * 2**-9)
    d = quantize_fp8_delayed_ref(x, "e5m2", f32(4.0), columnwise=False)
    assert set(d) == {"rowwise_data", "rowwise_scale_inv", "amax"}
    assert d["rowwise_scale_inv"][0] == 0.25 and d["amax"][0] == out["amax"][0]


def test_mxfp8_layout_and_inf_block():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    x[0, 5] = np.inf
    x[40, 3] = np.nan
    out = quantize_mxfp8_ref(x, "e4m3")
    assert out["rowwise_scale_inv"].shape == (128, 4) and out["columnwise_scale_inv"].shape == (4, 128)
    assert out["rowwise_data"][0, 5] == 0x7E  # inf in a block -> multiplier 2^-127 -> saturates
    assert out["rowwise_scale_inv"][0, 0] == 254 and out["columnwise_scale_inv"][0, 5] == 254
    assert out["rowwise_data"][40, 3] == 0x7F
    assert np.all(out["rowwise_scale_inv"][64:] == 0) and np.all(out["rowwise_scale_inv"][:, 3:] == 0)
    xh = dequantize_mxfp8_ref(out["rowwise_data"], out["rowwise_scale_inv"], "e4m3", x.shape)
    ok = np.isfinite(x) & (np.arange(64)[:, None] != 0)
    assert np.allclose(xh[ok], x[ok], rtol=2**-3, atol=2**-6)
    two = quantize_mxfp8_ref(x[:, :64], "e5m2", two_d=True)
    assert np.array_equal(two["rowwise_data"], two["columnwise_data"])
    assert np.array_equal(two["rowwise_scale_inv"][:64, :2], np.repeat(two["columnwise_scale_inv"][:2, :64:32], 32, axis=0))
    with pytest.raises(ValueError):
        quantize_mxfp8_ref(np.zeros((16, 32), np.float32), "e4m3")


@pytest.mark.parametrize("block_dim", [1, 2])
def test_fp8_block_layout(block_dim):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((256, 384)) * np.exp2(rng.integers(-8, 8, (256, 1)))).astype(ml_dtypes.bfloat16)
    out = quantize_fp8_block_ref(x, "e4m3", block_dim=block_dim)
    rs, cs = out["rowwise_scale_inv"], out["columnwise_scale_inv"]
    if block_dim == 1:
        assert rs.shape == (3, 256) and cs.shape == (2, 384)
    else:
        assert rs.shape == (2, 4) and cs.shape == (3, 4)
        assert np.array_equal(out["columnwise_data"], out["rowwise_data"].T)
        assert np.array_equal(cs[:3, :2], rs[:2, :3].T) and np.all(rs[:, 3] == 0)
    assert np.all(np.log2(rs[rs > 0]) % 1 == 0)  # pow2 default
    xf = x.astype(np.float32)
    for cw, data, sc in [(False, out["rowwise_data"], rs), (True, out["columnwise_data"], cs)]:
        xh = dequantize_fp8_block_ref(data, sc, "e4m3", x.shape, columnwise=cw, block_dim=block_dim)
        assert np.allclose(xh, xf, rtol=2**-3, atol=np.abs(xf).max() * 2**-16)
    with pytest.raises(ValueError):
        quantize_fp8_block_ref(np.zeros((128, 64), np.float32), "e4m3")


@pytest.mark.parametrize("with_rht,two_d,stochastic", [(False, False, False), (True, False, True), (False, True, False)])
def test_nvfp4_layout_and_roundtrip(with_rht, two_d, stochastic):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 64, 48)).astype(ml_dtypes.bfloat16)
    out = quantize_nvfp4_ref(x, with_rht=with_rht, two_d=two_d, stochastic=stochastic, rng=(123, 7))
    assert out["rowwise_data"].shape == (2, 64, 24) and out["columnwise_data"].shape == (48, 64)
    assert out["rowwise_scale_inv"].shape == (128, 4) and out["columnwise_scale_inv"].shape == (128, 8)
    xf = x.astype(np.float32).reshape(128, 48)
    assert out["amax"][0] == np.abs(xf).max()
    xh = dequantize_nvfp4_ref(out["rowwise_data"], out["rowwise_scale_inv"], out["amax"], x.shape)
    tol = np.abs(xf).max() * (0.6 if stochastic else 0.3)
    assert np.max(np.abs(xh.reshape(128, 48) - xf)) <= tol
    target = rht_ref(np.ascontiguousarray(xf.T)).T if with_rht else xf
    assert out["columnwise_amax"][0] == np.abs(target).max()
    xc = dequantize_nvfp4_ref(out["columnwise_data"], out["columnwise_scale_inv"], out["columnwise_amax"], x.shape, columnwise=True)
    assert np.max(np.abs(xc.reshape(128, 48) - target)) <= np.abs(target).max() * (0.6 if stochastic else 0.3)
    if two_d:
        assert np.array_equal(unpack_e2m1_ref(out["columnwise_data"]), unpack_e2m1_ref(out["rowwise_data"].reshape(128, 24)).T)
    with pytest.raises(ValueError):
        quantize_nvfp4_ref(x.astype(np.float32), with_rht=True)


def test_nvfp4_scale_formulas_hand_case():
    x = np.zeros((16, 16), np.float32)
    x[0, :] = np.linspace(-3, 3, 16, dtype=np.float32)
    out = quantize_nvfp4_ref(x, columnwise=False)
    A = f32(3)
    s_enc = f32(2688) / A
    factor = s_enc * (f32(1) / f32(6))
    d = decode_fp8_ref(cast_fp8_ref(A * factor, "e4m3"), "e4m3")
    assert out["rowwise_scale_inv"][0, 0] == cast_fp8_ref(A * factor, "e4m3")
    assert np.all(out["rowwise_scale_inv"][1:16, 0] == 0)  # all-zero blocks: d_b = 0, data 0
    assert np.all(out["rowwise_data"][1:] == 0)
    m = min(f32(1) / (d * (f32(1) / s_enc)), FLT_MAX)
    assert np.array_equal(unpack_e2m1_ref(out["rowwise_data"][0:1])[0], cast_e2m1_ref(x[0] * m))


def test_round_to_dtype():
    v = f32([1.0 + 2**-8, 1.0 + 3 * 2**-8, 70000.0])
    assert round_to_dtype_ref(v, "bfloat16").astype(np.float32).tolist() == [1.0, 1.015625, 70144.0]
    assert np.isinf(round_to_dtype_ref(v, "float16")[2])
    assert round_to_dtype_ref(v, "float32").tolist() == v.tolist()


