"""PyTorch NVFP4 (NUMERICS.md §7): bytes vs the NumPy reference, RHT, stochastic rounding,
dequantize, errors, torch.compile and opcheck."""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import (INPUT_FAMILIES, assert_bytes_equal, assert_quantized_equal, fields_as_numpy, from_torch, make_input,
                     no_recompiles, to_torch)
from quantize_block_cases import (
    DIVISIBILITY_MESSAGES,
    NON_MULTIPLE_SHAPES,
    NVFP4_QUANTIZERS,
    RNG_STATE,
    SR_DRAWS,
    assert_sr_unbiased,
    block_cases,
    check_dequantize_copies,
    case_id,
    reference_quantize,
    rng_for,
    sr_probe_input,
    unit_scale_blocks,
)
from twinengine.testing import reference as ref

import twinengine as te
import twinengine.pytorch as tep

CASES = [c for c in block_cases() if c[0].scaling_mode == "nvfp4"]
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dequantize(qt: te.QuantizedTensor, dtype: str, columnwise: bool) -> torch.Tensor:
    return tep.dequantize(qt, TORCH_DTYPES[dtype], columnwise=columnwise)


def _rng(state: np.ndarray | None, dtype: torch.dtype = torch.int64) -> torch.Tensor | None:
    return None if state is None else torch.from_numpy(state.astype(np.int64)).to(dtype)


def _quantize(x_np: np.ndarray, q: te.Quantizer, state: np.ndarray | None = RNG_STATE) -> te.QuantizedTensor:
    return tep.quantize(to_torch(x_np), q, rng=_rng(rng_for(q, state)))


@pytest.mark.parametrize("family", INPUT_FAMILIES)
@pytest.mark.parametrize("q,shape,dtype", CASES, ids=case_id)
def test_quantize_nvfp4_matches_reference(q, shape, dtype, family):
    x = make_input(family, shape, dtype)
    qt = _quantize(x, q)
    assert qt.quantizer == q and qt.shape == shape and qt.dtype == dtype
    expected = reference_quantize(x, q, rng_for(q))
    assert_quantized_equal(fields_as_numpy(qt), expected, f"{case_id(q)} {family} {dtype}")


@pytest.mark.parametrize("q", [te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
                               te.NVFP4Quantizer(with_2d_quantization=True)], ids=case_id)
def test_quantize_nvfp4_large_input_matches_reference(q):
    # 512K elements: the CPU kernels split the work over threads (csrc/internal/cpu.h parallel_for).
    x = make_input("mixed_scales", (512, 1024), "bfloat16", seed=9)
    qt = _quantize(x, q)
    expected = reference_quantize(x, q, rng_for(q))
    assert_quantized_equal(fields_as_numpy(qt), expected, f"large {case_id(q)}")
    check_dequantize_copies(_dequantize, from_torch, qt, expected, "float32")


@pytest.mark.parametrize("out_dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("q", NVFP4_QUANTIZERS, ids=case_id)
def test_dequantize_nvfp4_matches_reference(q, out_dtype):
    x = make_input("mixed_scales", (2, 32, 48), "bfloat16", seed=1)
    qt = _quantize(x, q)
    expected_fields = reference_quantize(x, q, rng_for(q))
    check_dequantize_copies(_dequantize, from_torch, qt, expected_fields, out_dtype)


# Hand-encoded E2M1 casts (§1): value -> expected code. Grid {0, .5, 1, 1.5, 2, 3, 4, 6}; ties
# (midpoints) go to the even code; the sign of zero is kept.
E2M1_EDGES = [
    (0.0, 0x0), (-0.0, 0x8), (1e-30, 0x0), (-1e-30, 0x8), (0.25, 0x0), (-0.25, 0x8), (0.2500001, 0x1),
    (0.5, 0x1), (0.75, 0x2), (0.7499999, 0x1), (1.0, 0x2), (1.25, 0x2), (1.2500001, 0x3), (1.5, 0x3),
    (1.75, 0x4), (-1.75, 0xC), (2.0, 0x4), (2.5, 0x4), (2.5000002, 0x5), (3.0, 0x5), (3.5, 0x6),
    (3.4999998, 0x5), (4.0, 0x6), (5.0, 0x6), (5.0000005, 0x7), (-5.0000005, 0xF), (6.0, 0x7), (-6.0, 0xF),
    (np.nan, 0x7),
]


def test_quantize_nvfp4_e2m1_cast_edge_values():
    values = np.array([v for v, _ in E2M1_EDGES] + [0.0] * (30 - len(E2M1_EDGES)), np.float32)
    x = unit_scale_blocks(np.tile(values, (16, 1)))  # (16, 32): NVFP4 needs R % 16 == 0
    q = te.NVFP4Quantizer(columnwise=False)
    qt = tep.quantize(torch.from_numpy(x), q)
    assert_quantized_equal(fields_as_numpy(qt), reference_quantize(x, q), "E2M1 edges")
    codes = ref.unpack_e2m1_ref(qt.rowwise_data.numpy())[0].reshape(2, 16)[:, 1:].reshape(30)
    assert codes[:len(E2M1_EDGES)].tolist() == [c for _, c in E2M1_EDGES]


def test_dequantize_nvfp4_decodes_all_16_codes():
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    x = unit_scale_blocks(np.tile(np.array(grid[1:] + [-g for g in grid] + [0.0] * 15, np.float32), (16, 1)))
    y = tep.dequantize(tep.quantize(torch.from_numpy(x), te.NVFP4Quantizer(columnwise=False))).numpy()
    assert_bytes_equal(y, x, "E2M1 codes 0x1..0x7, 0x8..0xF decode to their grid values")
    assert np.signbit(y[0, 8])  # code 0x8 is -0.0


# ---- stochastic rounding ---------------------------------------------------------------

@pytest.mark.parametrize("rng_dtype", [torch.int64, torch.uint32, torch.int32])
def test_quantize_nvfp4_sr_reads_the_low_32_bits_of_any_rng_dtype(rng_dtype):
    q = te.NVFP4Quantizer(stochastic_rounding=True)
    x = make_input("normal_1", (32, 64), "float32", seed=3)
    state = np.array([7, 123456], np.uint32)  # fits int32 too
    qt = tep.quantize(to_torch(x), q, rng=_rng(state, rng_dtype))
    assert_quantized_equal(fields_as_numpy(qt), reference_quantize(x, q, state), f"rng {rng_dtype}")


def test_quantize_nvfp4_sr_different_offset_different_bytes():
    q = te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True)
    x = make_input("normal_1", (64, 64), "bfloat16", seed=4)
    a = fields_as_numpy(_quantize(x, q, np.array([11, 0], np.uint32)))
    b = fields_as_numpy(_quantize(x, q, np.array([11, 1], np.uint32)))
    c = fields_as_numpy(_quantize(x, q, np.array([12, 0], np.uint32)))
    again = fields_as_numpy(_quantize(x, q, np.array([11, 0], np.uint32)))
    assert_quantized_equal(again, a, "same state, same bytes")
    for other, what in ((b, "offset"), (c, "seed")):
        for name in ("rowwise_data", "columnwise_data"):
            assert not np.array_equal(other[name], a[name]), f"a different {what} gave the same {name}"
        for name in ("rowwise_scale_inv", "columnwise_scale_inv", "amax", "columnwise_amax"):
            assert_bytes_equal(other[name], a[name], f"{name} (scales are those of round-to-nearest)")


def test_quantize_nvfp4_sr_is_unbiased():
    x = sr_probe_input()
    sr_q = te.NVFP4Quantizer(columnwise=False, stochastic_rounding=True)
    samples = []
    for offset in range(SR_DRAWS):
        qt = tep.quantize(torch.from_numpy(x), sr_q, rng=torch.tensor([99, offset]))
        samples.append(tep.dequantize(qt).numpy())
    rne = tep.dequantize(tep.quantize(torch.from_numpy(x), te.NVFP4Quantizer(columnwise=False))).numpy()
    assert_sr_unbiased(np.stack(samples), rne, x)


def test_quantize_nvfp4_rng_is_required_iff_stochastic_rounding():
    x = torch.zeros(16, 16)
    with pytest.raises(ValueError, match=r"rounds stochastically and needs rng="):
        tep.quantize(x, te.NVFP4Quantizer(stochastic_rounding=True))
    with pytest.raises(ValueError, match="rng= is only used by quantizers with stochastic rounding"):
        tep.quantize(x, te.NVFP4Quantizer(), rng=torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="rng must have dtype uint32, int32 or int64, got float32"):
        tep.quantize(x, te.NVFP4Quantizer(stochastic_rounding=True), rng=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"rng must have shape \(2,\)"):
        tep.quantize(x, te.NVFP4Quantizer(stochastic_rounding=True), rng=torch.tensor([1, 2, 3]))


# ---- RHT ----------------------------------------------------------------------------------

def test_quantize_nvfp4_rht_kernel_matrix_is_orthogonal():
    # Probe the kernel's H: column r of x is the unit vector e_(r mod 16) (exact in bf16), so the
    # RHT'd columnwise copy holds the rows of H (entries ±1/4). Every 1x16 block then has amax 1/4
    # and dequantizes to ±1/4 up to one fp32 rounding of the decode multiplier.
    x = np.eye(16, dtype=np.float32).astype(ml_dtypes.bfloat16)
    qt = tep.quantize(to_torch(x), te.NVFP4Quantizer(rowwise=False, with_rht=True))
    h = tep.dequantize(qt, columnwise=True).numpy().T  # (K, R): row j holds RHT(e_j) = H[j, :]
    np.testing.assert_allclose(h, ref.rht_matrix_ref(), rtol=2**-21, atol=0)
    np.testing.assert_allclose(h @ h.T, np.eye(16), rtol=0, atol=2**-20)


def test_quantize_nvfp4_rht_amax_is_post_transform_and_round_trips():
    x = make_input("normal_1", (64, 32), "bfloat16", seed=6)
    x[3, 5] = 40.0  # one spike: the RHT spreads it, so the post-RHT amax is far smaller
    qt = tep.quantize(to_torch(x), te.NVFP4Quantizer(with_rht=True))
    xt = np.ascontiguousarray(x.astype(np.float32).T)
    post = ref.rht_ref(xt)
    assert qt.amax.item() == np.float32(40.0)
    assert qt.columnwise_amax.item() == np.abs(post).max() < 20.0
    # Undo the RHT of the dequantized columnwise copy: x'·Hᵀ recovers x to NVFP4 accuracy (a
    # relative error near 0.1; a wrong transform, e.g. another sign mask, gives about 1.4).
    h = ref.rht_matrix_ref().astype(np.float64)
    xt_hat = tep.dequantize(qt, columnwise=True).numpy().T.astype(np.float64)  # RHT(xᵀ), (K, R)
    back = (xt_hat.reshape(32, 4, 16) @ h.T).reshape(32, 64).T
    rel = np.linalg.norm(back - x.astype(np.float64)) / np.linalg.norm(x.astype(np.float64))
    assert rel < 0.15, rel


def test_quantize_nvfp4_rht_sums_in_index_order():
    # Each 16-chunk is (2^26, 2^18, 4, ..., 4): p_0 = 2^24, p_1 = ±2^16, p_j = ±1. Summed in
    # index order from p_0, every ±1 is a tie at the fp32 ulp 2 and rounds back to the even
    # 2^24 + 2^16, itself a bf16 tie that rounds to 2^24. Summing the small products first (as
    # an MMA or a tree would) reaches 2^24 + 2^16 + 2 for some outputs, which rounds up to
    # 2^24 + 2^17 in bf16 and moves the post-RHT amax.
    chunk = np.array([2.0**26, 2.0**18] + [4.0] * 14, np.float32)
    x = np.repeat(chunk[:, None], 32, axis=1).astype(ml_dtypes.bfloat16)  # (R, K) = (16, 32)
    q = te.NVFP4Quantizer(rowwise=False, with_rht=True)
    qt = tep.quantize(to_torch(x), q)
    assert_quantized_equal(fields_as_numpy(qt), reference_quantize(x, q), "adversarial RHT order")
    assert qt.columnwise_amax.item() == 2.0**24
    h = ref.rht_matrix_ref()
    products = chunk[:, None] * h  # [j, i], exact
    small_first = (products[2:].sum(axis=0, dtype=np.float32) + products[1]) + products[0]
    assert np.abs(small_first.astype(ml_dtypes.bfloat16).astype(np.float32)).max() > 2.0**24


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_quantize_nvfp4_rht_needs_bf16_only_with_columnwise(dtype):
    x = to_torch(make_input("normal_1", (16, 32), dtype))
    with pytest.raises(TypeError, match=f"NVFP4 with_rht=True with columnwise usage needs bfloat16 x.*got {dtype}"):
        tep.quantize(x, te.NVFP4Quantizer(with_rht=True))
    rowwise_only = te.NVFP4Quantizer(columnwise=False, with_rht=True)
    assert_quantized_equal(fields_as_numpy(tep.quantize(x, rowwise_only)),
                           fields_as_numpy(tep.quantize(x, te.NVFP4Quantizer(columnwise=False))), "with_rht ignored")


@pytest.mark.parametrize("shape", NON_MULTIPLE_SHAPES["nvfp4"], ids=str)
def test_quantize_nvfp4_rejects_non_multiple_shapes(shape):
    with pytest.raises(ValueError, match=f"twinengine.quantize: {DIVISIBILITY_MESSAGES['nvfp4']}"):
        tep.quantize(torch.zeros(shape), te.NVFP4Quantizer())


# ---- compile and opcheck ----------------------------------------------------------------

# One compiled function for every NVFP4 quantizer: quantize, then dequantize both copies.
def _roundtrip(x, q, rng):
    qt = tep.quantize(x, q, rng=rng)
    return qt, tep.dequantize(qt, torch.float32), tep.dequantize(qt, torch.bfloat16, columnwise=True)


_COMPILED_ROUNDTRIP = torch.compile(_roundtrip, fullgraph=True, backend="inductor")
COMPILE_QUANTIZERS = [te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True),
                      te.NVFP4Quantizer(with_2d_quantization=True)]


@pytest.mark.parametrize("q", COMPILE_QUANTIZERS, ids=case_id)
def test_quantize_nvfp4_compiled_matches_eager(q):
    x = to_torch(make_input("nan_inf", (2, 32, 48), "bfloat16"))
    for offset in (0, 5):  # a new rng value is a new input, not a recompile
        rng = _rng(rng_for(q, np.array([3, offset], np.uint32)))
        eager, compiled = _roundtrip(x, q, rng), _COMPILED_ROUNDTRIP(x, q, rng)
        assert_quantized_equal(fields_as_numpy(compiled[0]), fields_as_numpy(eager[0]), "compiled vs eager")
        for got, want in zip(compiled[1:], eager[1:]):
            assert_bytes_equal(from_torch(got), from_torch(want), "dequantized")


def test_quantize_nvfp4_new_rng_value_does_not_recompile():
    q = te.NVFP4Quantizer(stochastic_rounding=True)
    fn = torch.compile(lambda x, rng: tep.quantize(x, q, rng=rng).rowwise_data, fullgraph=True, backend="eager")
    x = torch.randn(16, 32)
    fn(x, torch.tensor([1, 0]))
    with no_recompiles():
        for offset in range(1, 3):
            fn(x, torch.tensor([1, offset]))


def test_quantize_nvfp4_dynamic_batch_does_not_recompile():
    q = te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True)
    fn = torch.compile(lambda x, rng: tep.dequantize(tep.quantize(x, q, rng=rng), torch.float32, columnwise=True),
                       fullgraph=True, dynamic=True, backend="inductor")
    rng = torch.tensor([4, 2])
    for rows in (32, 48, 96):
        x = to_torch(make_input("normal_1", (rows, 64), "bfloat16", seed=rows))
        eager = tep.dequantize(tep.quantize(x, q, rng=rng), torch.float32, columnwise=True)
        with no_recompiles() if rows != 32 else contextlib.nullcontext():
            got = fn(x, rng)
        assert_bytes_equal(from_torch(got), from_torch(eager), f"dynamic rows={rows}")


def test_quantize_nvfp4_opcheck():
    q = te.NVFP4Quantizer(with_rht=True, stochastic_rounding=True)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    rng = torch.tensor([5, 6])
    torch.library.opcheck(torch.ops.twinengine.quantize.default, (x, q, None, rng))
    qt = tep.quantize(x, q, rng=rng)
    torch.library.opcheck(torch.ops.twinengine.dequantize.default,
                          (qt.columnwise_data, qt.columnwise_scale_inv, qt.columnwise_amax, q, [32, 64], "float32",
                           True))


@pytest.mark.parametrize("q", NVFP4_QUANTIZERS, ids=case_id)
def test_quantize_nvfp4_given_amax_matches_reference(q):
    """quantize(x, q, amax=[A_row, A_col]) forms the scales from the given global amaxes
    (§7 step 1's all-reduce MAX), byte for byte the reference with those amaxes."""
    x_np = make_input("normal_1", (64, 48), "bfloat16", seed=5)
    given = np.array([7.5, 11.25], dtype=np.float32)  # above the input's own amaxes
    state = rng_for(q)
    got = tep.quantize(to_torch(x_np), q, rng=_rng(state), amax=torch.from_numpy(given))
    want = ref.quantize_nvfp4_ref(x_np, rowwise=q.rowwise, columnwise=q.columnwise, with_rht=q.with_rht,
                                  two_d=q.with_2d_quantization, stochastic=q.stochastic_rounding,
                                  rng=(0, 0) if state is None else tuple(state), global_amax=given)
    assert_quantized_equal(fields_as_numpy(got), want, case_id(q))


@pytest.mark.parametrize("q", [te.NVFP4Quantizer(with_rht=True), te.NVFP4Quantizer(with_2d_quantization=True)],
                         ids=case_id)
def test_quantize_nvfp4_shards_with_whole_amax_equal_whole(q):
    """Row shards quantized with the whole tensor's amaxes (what a sequence-parallel group's MAX
    all-reduce gives them) are the whole quantization's rows / columns, data and scales."""
    x = to_torch(make_input("normal_1", (128, 64), "bfloat16", seed=9))
    whole = tep.quantize(x, q)
    amax = torch.cat([whole.amax, whole.columnwise_amax])
    for i in range(2):
        rows = slice(64 * i, 64 * (i + 1))
        part = tep.quantize(x[rows], q, amax=amax)
        assert torch.equal(part.rowwise_data, whole.rowwise_data[rows])
        assert torch.equal(part.rowwise_scale_inv[:64], whole.rowwise_scale_inv[rows])
        assert torch.equal(part.columnwise_data, whole.columnwise_data[:, 32 * i:32 * (i + 1)])
        assert torch.equal(part.columnwise_scale_inv[:, :4], whole.columnwise_scale_inv[:, 4 * i:4 * (i + 1)])
        assert torch.equal(part.amax, whole.amax) and torch.equal(part.columnwise_amax, whole.columnwise_amax)


def test_quantize_nvfp4_given_amax_errors():
    x = torch.ones(32, 32)
    with pytest.raises(ValueError, match="amax= .* is only used by NVFP4Quantizer, not MXFP8Quantizer"):
        tep.quantize(x, te.MXFP8Quantizer(), amax=torch.ones(2))
    with pytest.raises(ValueError, match=r"amax must be float32 of shape \(2,\)"):
        tep.quantize(x, te.NVFP4Quantizer(), amax=torch.ones(1))
