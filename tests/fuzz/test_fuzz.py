"""Seeded property-based fuzzer over the public ops and modules of both frontends.

Every drawn call (valid or not) must give, in torch eager, torch.compile (a shared compiled
function, sampled), JAX eager and jax.jit: the NumPy reference's bytes where the reference
defines them, otherwise identical bytes across the frontends, otherwise the same clear error
(TypeError / ValueError, text starting "twinengine.") everywhere. Budget: --fuzz-budget
examples per property (derandomized, so a failure reproduces)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch
from helpers import NUMPY_DTYPES, assert_bytes_equal, assert_quantized_equal, fields_as_numpy, to_torch
from hypothesis import strategies as st
from quantize_cases import DELAYED_SCALE, reference_quantize
from reference import permute as pref

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine import recipe as R

DTYPES = ("float32", "bfloat16", "float16")
FAMILIES = ("normal", "tiny", "huge", "specials", "zeros")


VALID = {}
"""property -> number of drawn calls that were valid (each property must exercise some)."""


def _count_valid(name: str) -> None:
    VALID[name] = VALID.get(name, 0) + 1


def _assert_exercised(name: str, request) -> None:
    if request.config.getoption("--fuzz-budget") >= 10:
        assert VALID.get(name, 0) > 0, f"{name}: no valid call was drawn; the strategy only produces errors"


def _outcome(fn):
    """('ok', value) or ('error', type, text); anything but our clear errors fails the fuzzer."""
    try:
        return ("ok", fn())
    except (TypeError, ValueError) as error:
        assert str(error).startswith("twinengine."), f"an error that is not ours: {type(error).__name__}: {error}"
        return ("error", type(error), str(error))


def _same_errors(outcomes: dict, what: str) -> bool:
    """True when every frontend raised (then: the same type and text); asserts they agree."""
    kinds = {name: o[0] for name, o in outcomes.items()}
    assert len(set(kinds.values())) == 1, f"{what}: some frontends raised and some did not: " + repr(
        {n: o if o[0] == "error" else "ok" for n, o in outcomes.items()})
    if "error" in kinds.values():
        errors = {o[1:] for o in outcomes.values()}
        assert len(errors) == 1, f"{what}: different errors {errors}"
        return True
    return False


@st.composite
def arrays(draw, shape=None):
    if shape is None:
        rank = draw(st.integers(1, 3))
        shape = tuple(draw(st.sampled_from([1, 2, 16, 32, 48, 64, 128])) for _ in range(rank))
    dtype = draw(st.sampled_from(DTYPES))
    family = draw(st.sampled_from(FAMILIES))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape).astype(np.float32)
    x *= {"normal": 1.0, "tiny": 1e-39, "huge": 1e30, "specials": 10.0, "zeros": 0.0}[family]
    if family == "specials" and x.size:
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, 3)] = [np.nan, np.inf, -np.inf]
    with np.errstate(over="ignore"):
        return x.astype(NUMPY_DTYPES[dtype])


QUANTIZERS = st.one_of(
    st.builds(te.Float8CurrentScalingQuantizer, st.sampled_from(["e4m3", "e5m2"]), rowwise=st.booleans(),
              columnwise=st.just(True), force_pow_2_scales=st.booleans(),
              amax_epsilon=st.sampled_from([0.0, 1e-3])),
    st.builds(te.Float8DelayedScalingQuantizer, st.sampled_from(["e4m3", "e5m2"]), columnwise=st.booleans()),
    st.builds(te.MXFP8Quantizer, st.sampled_from(["e4m3", "e5m2"]), with_2d_quantization=st.booleans(),
              columnwise=st.booleans()),
    st.builds(te.Float8BlockQuantizer, st.just("e4m3"), block_scaling_dim=st.sampled_from([1, 2])),
    st.builds(te.NVFP4Quantizer, with_rht=st.booleans(), with_2d_quantization=st.booleans()),
)


def _torch_quantize(x, q):
    scale = torch.from_numpy(DELAYED_SCALE) if q.scaling_mode == "fp8_delayed" else None
    return fields_as_numpy(tep.quantize(to_torch(x), q, scale=scale))


def _jax_quantize(x, q, jit):
    scale = jnp.asarray(DELAYED_SCALE) if q.scaling_mode == "fp8_delayed" else None
    fn = (lambda v, s: tej.quantize(v, q, scale=s))
    return fields_as_numpy((jax.jit(fn) if jit else fn)(jnp.asarray(x), scale))


def test_fuzz_quantize_dequantize(fuzz_settings, request):
    from hypothesis import given

    @fuzz_settings
    @given(x=arrays(), q=QUANTIZERS)
    def run(x, q):
        outcomes = {"torch": _outcome(lambda: _torch_quantize(x, q)),
                    "jax": _outcome(lambda: _jax_quantize(x, q, False)),
                    "jit": _outcome(lambda: _jax_quantize(x, q, True))}
        if _same_errors(outcomes, f"quantize {q!r} {x.dtype}{x.shape}"):
            return
        _count_valid("quantize")
        fields = outcomes["torch"][1]
        for name in ("jax", "jit"):
            assert_quantized_equal(outcomes[name][1], fields, f"{name} vs torch {q!r}")
        if q.scaling_mode in ("fp8_current", "fp8_delayed", "mxfp8"):
            assert_quantized_equal(fields, reference_quantize(x, q), f"torch vs reference {q!r}")
        # dequantize the rowwise copy in both frontends: same bytes
        if q.rowwise:
            scale = torch.from_numpy(DELAYED_SCALE) if q.scaling_mode == "fp8_delayed" else None
            t = tep.dequantize(tep.quantize(to_torch(x), q, scale=scale), torch.float32).numpy()
            jscale = None if scale is None else jnp.asarray(DELAYED_SCALE)
            j = np.asarray(tej.dequantize(tej.quantize(jnp.asarray(x), q, scale=jscale), jnp.float32))
            assert_bytes_equal(j, t, f"dequantize {q!r}")

    run()
    _assert_exercised("quantize", request)


# dynamic=True: sizes are symbolic, so error messages must still become constant text
_COMPILED_QUANTIZE = torch.compile(lambda x, q, s: tep.quantize(x, q, scale=s), fullgraph=True, backend="aot_eager",
                                   dynamic=True)


def test_fuzz_quantize_compiled_matches_eager(fuzz_settings, request):
    from hypothesis import given, settings

    budget = max(1, request.config.getoption("--fuzz-budget") // 4)  # each new quantizer compiles

    @settings(fuzz_settings, max_examples=budget)
    @given(x=arrays(), q=QUANTIZERS)
    def run(x, q):
        scale = torch.from_numpy(DELAYED_SCALE) if q.scaling_mode == "fp8_delayed" else None
        eager = _outcome(lambda: fields_as_numpy(tep.quantize(to_torch(x), q, scale=scale)))
        compiled = _outcome(lambda: fields_as_numpy(_COMPILED_QUANTIZE(to_torch(x), q, scale)))
        if _same_errors({"eager": eager, "compiled": compiled}, f"compiled quantize {q!r}"):
            return
        assert_quantized_equal(compiled[1], eager[1], f"compiled vs eager {q!r}")

    torch._dynamo.reset()
    with torch._dynamo.config.patch(cache_size_limit=64, accumulated_cache_size_limit=512):
        run()


@st.composite
def routing(draw):
    tokens = draw(st.integers(1, 12))
    hidden = draw(st.sampled_from([1, 4, 16]))
    map_type = draw(st.sampled_from(["index", "mask"]))
    experts = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if map_type == "index":
        topk = draw(st.integers(1, experts))
        rmap = np.stack([rng.permutation(experts)[:topk] for _ in range(tokens)]).astype(
            draw(st.sampled_from([np.int32, np.int64])))
        if draw(st.booleans()) and tokens > 1:  # occasionally a malformed map
            rmap = rmap[:, 0] if draw(st.booleans()) else rmap.astype(np.float32)
    else:
        rmap = (rng.random((tokens, experts)) < 0.5).astype(draw(st.sampled_from([np.int32, np.uint8, np.bool_])))
    dtype = draw(st.sampled_from(["float32", "bfloat16", "float16", "int8", "float64"]))
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    x = x.astype(NUMPY_DTYPES.get(dtype, dtype))
    routed = int(np.count_nonzero(rmap)) if map_type == "mask" else int(np.prod(rmap.shape))
    # > 0: a mask map's "all routed" default (<= 0) needs concrete values, which jit does not have
    num_out = draw(st.sampled_from([max(routed, 1), max(routed - 1, 1), routed + 2]))
    return x, rmap, map_type, num_out


def test_fuzz_moe_permute_unpermute(fuzz_settings, request):
    from hypothesis import given

    @fuzz_settings
    @given(case=routing())
    def run(case):
        x, rmap, map_type, num_out = case
        if x.dtype == np.float64:
            x = x.astype(np.float32)  # JAX without x64 would silently narrow float64; torch-only below

        def torch_call():
            out, row_id_map = tep.moe_permute(to_torch(x), torch.from_numpy(rmap), num_out, map_type)
            return from_any(out), row_id_map.numpy()

        def jax_call(jit):
            fn = lambda v, m: tej.moe_permute(v, m, num_out, map_type)  # noqa: E731
            out, row_id_map = (jax.jit(fn) if jit else fn)(jnp.asarray(x), jnp.asarray(rmap.astype(np.int32)
                                                                                      if rmap.dtype == np.int64
                                                                                      else rmap))
            return np.asarray(out), np.asarray(row_id_map)

        outcomes = {"torch": _outcome(torch_call), "jax": _outcome(lambda: jax_call(False)),
                    "jit": _outcome(lambda: jax_call(True))}
        if _same_errors(outcomes, f"moe_permute {map_type} {rmap.dtype}{rmap.shape} x {x.dtype}"):
            return
        _count_valid("permute")
        out, row_id_map = outcomes["torch"][1]
        for name in ("jax", "jit"):
            assert_bytes_equal(outcomes[name][1][0], out, f"{name} permute output")
            assert_bytes_equal(outcomes[name][1][1], row_id_map, f"{name} row_id_map")
        expected_map = (pref.row_id_map_index_ref if map_type == "index" else pref.row_id_map_mask_ref)(
            rmap.astype(np.int32), num_out)
        assert_bytes_equal(row_id_map, expected_map, "row_id_map vs reference")
        assert_bytes_equal(out, pref.permute_ref(x, expected_map, map_type, num_out)[0], "permute vs reference")
        if x.dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
            back = tep.moe_unpermute(to_torch(out), torch.from_numpy(row_id_map), map_type=map_type,
                                     restore_shape=x.shape)
            assert_bytes_equal(from_any(back), pref.unpermute_ref(out, expected_map, map_type, x.shape[0]),
                               "unpermute vs reference")

    run()
    _assert_exercised("permute", request)


def from_any(t) -> np.ndarray:
    from helpers import from_torch

    return from_torch(t)


RECIPES = st.sampled_from([None, R.MXFP8BlockScaling(), R.Float8CurrentScaling(), R.Float8BlockScaling(),
                           R.DelayedScaling(amax_history_len=2), R.NVFP4BlockScaling()])


def test_fuzz_linear_dense(fuzz_settings, request):
    from hypothesis import given

    @fuzz_settings
    @given(rows=st.sampled_from([0, 16, 32, 128]), k=st.sampled_from([0, 16, 32, 128]),
           n=st.sampled_from([16, 32, 128]), dtype=st.sampled_from(DTYPES), recipe=RECIPES,
           seed=st.integers(0, 2**16))
    def run(rows, k, n, dtype, recipe, seed):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((rows, k)).astype(np.float32).astype(NUMPY_DTYPES[dtype])
        w = (rng.standard_normal((n, k)) * 0.1).astype(np.float32).astype(NUMPY_DTYPES[dtype])
        delayed = isinstance(recipe, R.DelayedScaling)

        def torch_call():
            state = (torch.zeros(2, 2), torch.ones(2), torch.zeros(2, 1), torch.ones(1))
            xt = to_torch(x).requires_grad_()
            with tep.autocast(recipe, enabled=recipe is not None):
                y = tep.linear(xt, to_torch(w), delayed_state=state if delayed else None,
                               rng=torch.tensor([seed, 0]))
            y.float().sum().backward()
            return from_any(y), from_any(xt.grad)

        def jax_call(jit):
            def loss(xv, kv):
                out = tej.dense(xv, kv, recipe=recipe, state=tej.delayed_scaling_state(2) if delayed else None,
                                rng=jnp.array([seed, 0], jnp.int32))
                y = out[0] if delayed else out
                return y.astype(jnp.float32).sum(), y

            fn = jax.grad(loss, has_aux=True)
            dx, y = (jax.jit(fn) if jit else fn)(jnp.asarray(x), jnp.asarray(w.T))
            return np.asarray(y), np.asarray(dx)

        outcomes = {"torch": _outcome(torch_call), "jax": _outcome(lambda: jax_call(False)),
                    "jit": _outcome(lambda: jax_call(True))}
        if _same_errors(outcomes, f"linear {recipe!r} {dtype} ({rows},{k})x({n},{k})"):
            return
        _count_valid("linear")
        for name in ("jax", "jit"):
            for got, want, label in zip(outcomes[name][1], outcomes["torch"][1], ("y", "dx")):
                assert_bytes_equal(got, want, f"{name} {label} {recipe!r}")

    run()
    _assert_exercised("linear", request)


def test_fuzz_record_amax_and_update(fuzz_settings):
    from hypothesis import given
    from twinengine.testing import reference as qref

    values = st.sampled_from([0.0, -0.0, 1e-40, 1e-45, 1.5, 448.0, 3e38, float("inf"), float("nan")])

    @fuzz_settings
    @given(history=st.lists(values, min_size=4, max_size=4), amax=values,
           algo=st.sampled_from(["max", "most_recent"]), margin=st.integers(0, 3))
    def run(history, amax, algo, margin):
        h = np.array(history, np.float32).reshape(4, 1)
        a = np.array([amax], np.float32)
        expected = qref.record_amax_ref(h, a)
        t = tep.record_amax(torch.from_numpy(h), torch.from_numpy(a)).numpy()
        j = np.asarray(jax.jit(tej.record_amax)(jnp.asarray(h), jnp.asarray(a)))
        assert_bytes_equal(t, expected, "torch record_amax")
        assert_bytes_equal(j, expected, "jax record_amax")
        scale = np.ones(1, np.float32)
        eh, es = qref.delayed_scaling_update_ref(expected, scale, "e4m3", margin, algo)
        th, ts = tep.update_delayed_scaling(torch.from_numpy(t), torch.from_numpy(scale), "e4m3", margin=margin,
                                            amax_compute_algo=algo)
        jh, js = tej.update_delayed_scaling(jnp.asarray(j), jnp.asarray(scale), "e4m3", margin=margin,
                                            amax_compute_algo=algo)
        for got, want, label in ((th.numpy(), eh, "torch history"), (ts.numpy(), es, "torch scale"),
                                 (np.asarray(jh), eh, "jax history"), (np.asarray(js), es, "jax scale")):
            assert_bytes_equal(got, want, label)

    run()


GEMM_QUANTIZERS = st.sampled_from([None, te.MXFP8Quantizer("e4m3"), te.Float8CurrentScalingQuantizer("e4m3"),
                                   te.NVFP4Quantizer(), te.Float8BlockQuantizer("e4m3", block_scaling_dim=1)])


def test_fuzz_gemm(fuzz_settings, request):
    from hypothesis import given

    @fuzz_settings
    @given(m=st.sampled_from([1, 16, 32, 128]), n=st.sampled_from([16, 32, 128]),
           k=st.sampled_from([16, 32, 48, 128]), k_b=st.sampled_from([None, 16, 32]), q=GEMM_QUANTIZERS,
           a_col=st.booleans(), b_col=st.booleans(), bias=st.booleans(), out=st.sampled_from(DTYPES),
           seed=st.integers(0, 2**16))
    def run(m, n, k, k_b, q, a_col, b_col, bias, out, seed):
        rng = np.random.default_rng(seed)
        a_np = rng.standard_normal((m, k)).astype(np.float32)
        b_np = rng.standard_normal((n, k if k_b is None else k_b)).astype(np.float32)
        bias_np = rng.standard_normal(n).astype(np.float32) if bias else None
        tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[out]

        def torch_call():
            a, b = torch.from_numpy(a_np), torch.from_numpy(b_np)
            if q is not None:
                a, b = tep.quantize(a, q), tep.quantize(b, q)
            bt = None if bias_np is None else torch.from_numpy(bias_np)
            return from_any(tep.gemm(a, b, bt, a_columnwise=a_col, b_columnwise=b_col, out_dtype=tdtype))

        def jax_call(jit):
            def fn(av, bv, biasv):
                if q is not None:
                    av, bv = tej.quantize(av, q), tej.quantize(bv, q)
                return tej.gemm(av, bv, biasv, a_columnwise=a_col, b_columnwise=b_col, out_dtype=jnp.dtype(out))

            bias_j = None if bias_np is None else jnp.asarray(bias_np)
            return np.asarray((jax.jit(fn) if jit else fn)(jnp.asarray(a_np), jnp.asarray(b_np), bias_j))

        outcomes = {"torch": _outcome(torch_call), "jax": _outcome(lambda: jax_call(False)),
                    "jit": _outcome(lambda: jax_call(True))}
        if _same_errors(outcomes, f"gemm {q!r} ({m},{k})x({n},{k_b or k}) cols={a_col},{b_col}"):
            return
        _count_valid("gemm")
        for name in ("jax", "jit"):
            assert_bytes_equal(outcomes[name][1], outcomes["torch"][1], f"{name} gemm {q!r}")

    run()
    _assert_exercised("gemm", request)


def _linear_step(recipe):
    def step(x, w, seed):
        with tep.autocast(recipe, enabled=recipe is not None):
            return tep.linear(x, w, rng=torch.stack([seed, seed * 0]))
    return step


FUZZ_LINEAR_RECIPES = [None, R.MXFP8BlockScaling(), R.Float8CurrentScaling(), R.Float8BlockScaling(),
                       R.NVFP4BlockScaling()]
# one compiled step per recipe, the recipe a constant of it (passed as an argument under
# dynamic=True, Dynamo makes the recipe's float fields symbolic: a known gap, see the report)
_COMPILED_LINEAR = {i: torch.compile(_linear_step(r), fullgraph=True, backend="aot_eager", dynamic=True)
                    for i, r in enumerate(FUZZ_LINEAR_RECIPES)}


def test_fuzz_linear_compiled_matches_eager(fuzz_settings, request):
    from hypothesis import given, settings

    budget = max(1, request.config.getoption("--fuzz-budget") // 2)

    @settings(fuzz_settings, max_examples=budget)
    @given(rows=st.sampled_from([0, 32, 128]), k=st.sampled_from([0, 32, 128]), n=st.sampled_from([32, 128]),
           dtype=st.sampled_from(DTYPES), index=st.sampled_from(range(len(FUZZ_LINEAR_RECIPES))),
           seed=st.integers(0, 2**16))
    def run(rows, k, n, dtype, index, seed):
        recipe = FUZZ_LINEAR_RECIPES[index]
        rng = np.random.default_rng(seed)
        x = to_torch(rng.standard_normal((rows, k)).astype(np.float32).astype(NUMPY_DTYPES[dtype]))
        w = to_torch((rng.standard_normal((n, k)) * 0.1).astype(np.float32).astype(NUMPY_DTYPES[dtype]))
        s = torch.tensor(seed)

        def call(fn, grad=True):
            xi = x.clone().requires_grad_(grad)
            y = fn(xi, w, s)
            if not grad:
                return (from_any(y),)
            y.float().sum().backward()
            return from_any(y), from_any(xi.grad)

        # inputs require grad in both, valid or not: an invalid call raises our error compiled too
        outcomes = {"eager": _outcome(lambda: call(_linear_step(recipe))),
                    "compiled": _outcome(lambda: call(_COMPILED_LINEAR[index]))}
        if _same_errors(outcomes, f"compiled linear {recipe!r} {dtype} ({rows},{k})x({n},{k})"):
            return
        for got, want, label in zip(outcomes["compiled"][1], outcomes["eager"][1], ("y", "dx")):
            assert_bytes_equal(got, want, f"compiled {label} {recipe!r}")

    torch._dynamo.reset()
    with torch._dynamo.config.patch(cache_size_limit=64, accumulated_cache_size_limit=512):
        run()


# ---- the norm / activation / bias / dropout families ---------------------------------------

FAMILY_OPS = ("layernorm", "rmsnorm", "l2norm", "activation", "bias_add", "dropout")
ACTIVATION_KINDS = ("gelu", "swiglu", "relu", "srelu", "qgeglu", "silu", "clamped_swiglu", "bogus")


def _family_step(frontend, op, kind):
    """A function of arrays only (x, w, b, rng, eps, p as a 0-d array is not allowed: eps / p are
    drawn from a few constants baked into `op`), returning a tuple of arrays."""
    if frontend == "torch":
        from twinengine.pytorch._ops import activation as act, bias as bias_, dropout as drop, norm
    else:
        from twinengine.jax._ops import activation as act, bias as bias_, dropout as drop, norm
    name, value = op
    return {
        "layernorm": lambda x, w, b, r: norm.layernorm_fwd(x, w, b, value, kind == "zero_centered")[:3],
        "rmsnorm": lambda x, w, b, r: norm.rmsnorm_fwd(x, w, value, kind == "zero_centered")[:2],
        "l2norm": lambda x, w, b, r: norm.l2norm_fwd(x, value)[:2],
        "activation": lambda x, w, b, r: act.activation_fwd(x, kind)[:1],
        "bias_add": lambda x, w, b, r: (bias_.bias_add(x, b),),
        "dropout": lambda x, w, b, r: drop.dropout_fwd(x, value, r),
    }[name]


FAMILY_CALLS = [(name, value) for name in ("layernorm", "rmsnorm", "l2norm") for value in (1e-5, -1.0)] + [
    ("activation", None), ("bias_add", None), ("dropout", 0.25), ("dropout", 1.5)]
_COMPILED_FAMILY: dict = {}


def _compiled_family(index, kind):
    key = (index, kind)
    if key not in _COMPILED_FAMILY:
        _COMPILED_FAMILY[key] = torch.compile(_family_step("torch", FAMILY_CALLS[index], kind), fullgraph=True,
                                              backend="aot_eager", dynamic=True)
    return _COMPILED_FAMILY[key]


def test_fuzz_norm_activation_bias_dropout(fuzz_settings, request):
    from hypothesis import given

    @fuzz_settings
    @given(x=arrays(), index=st.sampled_from(range(len(FAMILY_CALLS))), kind=st.sampled_from(ACTIVATION_KINDS),
           param_features=st.sampled_from([None, 16]), param_dtype=st.sampled_from(DTYPES),
           seed=st.integers(0, 2**16), compiled=st.booleans())
    def run(x, index, kind, param_features, param_dtype, seed, compiled):
        op = FAMILY_CALLS[index]
        kind = kind if op[0] == "activation" else ("zero_centered" if seed % 2 else "plain")
        k = x.shape[-1] if param_features is None else param_features
        prng = np.random.default_rng(seed)
        w = prng.standard_normal(k).astype(np.float32).astype(NUMPY_DTYPES[param_dtype])
        b = prng.standard_normal(k).astype(np.float32).astype(NUMPY_DTYPES[param_dtype])
        r = np.array([seed, 7], np.int64)
        tfn, jfn = _family_step("torch", op, kind), _family_step("jax", op, kind)
        targs = [to_torch(a) for a in (x, w, b, r)]
        jargs = [jnp.asarray(a) for a in (x, w, b, r)]
        outcomes = {"torch": _outcome(lambda: [from_any(t) for t in tfn(*targs)]),
                    "jax": _outcome(lambda: [np.asarray(t) for t in jfn(*jargs)]),
                    "jit": _outcome(lambda: [np.asarray(t) for t in jax.jit(jfn)(*jargs)])}
        if compiled:  # sampled: one shared compiled function per (op, kind)
            outcomes["compiled"] = _outcome(lambda: [from_any(t) for t in _compiled_family(index, kind)(*targs)])
        if _same_errors(outcomes, f"{op} {kind} {x.dtype}{x.shape} params ({k},) {param_dtype}"):
            return
        _count_valid("families")
        for name in outcomes:
            for got, want in zip(outcomes[name][1], outcomes["torch"][1]):
                assert_bytes_equal(got, want, f"{name} vs torch {op} {kind}")

    with torch._dynamo.config.patch(cache_size_limit=64, accumulated_cache_size_limit=512):
        run()
    _assert_exercised("families", request)


# ---- op-based modules: eager vs compiled, outputs and gradients or the same error ----------

def _module_builders():
    return {
        "Sequential": lambda k, n: tep.ops.Sequential(tep.ops.LayerNorm(k), tep.ops.BasicLinear(k, n),
                                                      tep.ops.Bias(n), tep.ops.GELU()),
        "LayerNormLinear": lambda k, n: tep.LayerNormLinear(k, n),
        "LayerNormMLP": lambda k, n: tep.LayerNormMLP(k, n),
    }


MODULE_RECIPES = [None, R.MXFP8BlockScaling(), R.Float8CurrentScaling()]


def test_fuzz_op_modules_compiled_matches_eager(fuzz_settings, request):
    from hypothesis import given, settings

    budget = max(1, request.config.getoption("--fuzz-budget") // 4)
    builders = _module_builders()
    compiled_fns: dict = {}

    @settings(fuzz_settings, max_examples=budget)
    @given(name=st.sampled_from(sorted(builders)), rows=st.sampled_from([0, 32]), k=st.sampled_from([32, 64]),
           # x_features=16 (a mismatch) is the known gap of test_error_table.MODULES: the failed
           # norm's stand-in reaches the Linear's backward while AOT autograd traces it
           x_features=st.just(None), index=st.sampled_from(range(len(MODULE_RECIPES))),
           seed=st.integers(0, 2**16))
    def run(name, rows, k, x_features, index, seed):
        torch.manual_seed(0)
        module = builders[name](k, 32)
        recipe = MODULE_RECIPES[index]
        x = torch.from_numpy(np.random.default_rng(seed).standard_normal((rows, x_features or k)).astype(np.float32))

        def step(x):
            with tep.autocast(recipe, enabled=recipe is not None):
                return module(x)

        def call(fn):
            module.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_()
            y = fn(xi)
            y.float().sum().backward()
            return [from_any(y), from_any(xi.grad)] + [from_any(p.grad) for p in module.parameters()]

        key = (name, index, k)
        if key not in compiled_fns:
            compiled_fns[key] = (module, torch.compile(step, fullgraph=True, backend="aot_eager"))
        module, compiled_step = compiled_fns[key]
        outcomes = {"eager": _outcome(lambda: call(step)), "compiled": _outcome(lambda: call(compiled_step))}
        if _same_errors(outcomes, f"{name} {recipe!r} x ({rows},{x_features or k}) k={k}"):
            return
        _count_valid("modules")
        for got, want in zip(outcomes["compiled"][1], outcomes["eager"][1]):
            assert_bytes_equal(got, want, f"compiled {name} {recipe!r}")

    torch._dynamo.reset()
    with torch._dynamo.config.patch(cache_size_limit=64, accumulated_cache_size_limit=512):
        run()
    _assert_exercised("modules", request)


# ---- rotary position embedding --------------------------------------------------------------

_COMPILED_ROPE: dict = {}


def test_fuzz_rope(fuzz_settings, request):
    """apply_rotary_pos_emb forward and backward: the NumPy reference's bytes in torch eager, torch
    compiled (sampled), JAX eager and jit, or the same error everywhere (freqs wider than the
    head, odd rotary width, thd without / non-thd with cu_seqlens, a sequence longer than freqs)."""
    from elementwise_cases import assert_bytes_equal_nan
    from hypothesis import given
    from reference import rope as rref

    @fuzz_settings
    @given(fmt=st.sampled_from(["sbhd", "bshd", "thd"]), interleaved=st.booleans(), d=st.sampled_from([2, 8, 12]),
           d2=st.sampled_from([2, 4, 7, 8, 14]), s=st.sampled_from([1, 5, 9]), freq_rows=st.sampled_from([4, 9]),
           cu_mode=st.sampled_from(["auto", "missing", "extra"]), dtype=st.sampled_from(DTYPES),
           family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**16), compiled=st.booleans())
    def run(fmt, interleaved, d, d2, s, freq_rows, cu_mode, dtype, family, seed, compiled):
        prng = np.random.default_rng(seed)
        shape = {"sbhd": (s, 2, 3, d), "bshd": (2, s, 3, d), "thd": (s + 3, 3, d)}[fmt]
        x = draw_like(prng, shape, dtype, family)
        dy = draw_like(prng, shape, dtype, "normal")
        freqs = (prng.standard_normal((freq_rows, 1, 1, d2)) * 100).astype(np.float32)
        # thd: sequences of at most 4 tokens (<= freq_rows; a longer one is a data-dependent error the
        # kernel raises, torch's ValueError vs JAX's runtime error, tested in tests/pytorch/test_rope.py)
        # and a tail outside every sequence.
        first = min(s, 3)
        cu = np.array([0, first, first + min(s + 2 - first, 4)], np.int32) if fmt == "thd" else np.array([0, s], np.int32)
        use_cu = fmt == "thd" if cu_mode == "auto" else cu_mode == "extra"

        def torch_call(fn_x, fn_f, fn_cu):
            xt = fn_x.clone().requires_grad_(True)
            y = fn(xt, fn_f, fn_cu)
            (dx,) = torch.autograd.grad(y, xt, to_torch(dy))
            return [from_any(y), from_any(dx)]

        def fn(xv, fv, cuv):
            return tep.apply_rotary_pos_emb(xv, fv, fmt, interleaved, cu_seqlens=cuv)

        def jfn(xv, fv, cuv):
            y, vjp = jax.vjp(lambda v: tej.apply_rotary_pos_emb(v, fv, fmt, interleaved, cu_seqlens=cuv), xv)
            return [y, vjp(jnp.asarray(dy))[0]]

        cu_t = torch.from_numpy(cu) if use_cu else None
        cu_j = jnp.asarray(cu) if use_cu else None
        outcomes = {"torch": _outcome(lambda: torch_call(to_torch(x), torch.from_numpy(freqs), cu_t)),
                    "jax": _outcome(lambda: [np.asarray(a) for a in jfn(jnp.asarray(x), jnp.asarray(freqs), cu_j)]),
                    "jit": _outcome(lambda: [np.asarray(a) for a in jax.jit(jfn)(jnp.asarray(x), jnp.asarray(freqs),
                                                                                  cu_j)])}
        if compiled:
            key = (fmt, interleaved, use_cu)
            if key not in _COMPILED_ROPE:
                _COMPILED_ROPE[key] = torch.compile(fn, fullgraph=True, backend="aot_eager", dynamic=True)
            compiled_fn = _COMPILED_ROPE[key]

            def compiled_call():
                xt = to_torch(x).requires_grad_(True)
                y = compiled_fn(xt, torch.from_numpy(freqs), cu_t)
                (dx,) = torch.autograd.grad(y, xt, to_torch(dy))
                return [from_any(y), from_any(dx)]

            outcomes["compiled"] = _outcome(compiled_call)
        what = f"rope {fmt} interleaved={interleaved} x{shape} freqs({freq_rows}, {d2}) cu={use_cu} {dtype}"
        if _same_errors(outcomes, what):
            return
        _count_valid("rope")
        want = [rref.rope_ref(x, freqs, fmt, interleaved, cu if use_cu else None),
                rref.rope_ref(dy, freqs, fmt, interleaved, cu if use_cu else None, backward=True)]
        for name, (_, got) in outcomes.items():
            for g, w, part in zip(got, want, ("y", "dx")):
                assert_bytes_equal_nan(g, w, f"{name} {part} {what}")

    with torch._dynamo.config.patch(cache_size_limit=64, accumulated_cache_size_limit=512):
        run()
    _assert_exercised("rope", request)


def draw_like(prng, shape, dtype, family):
    x = prng.standard_normal(shape).astype(np.float32)
    x *= {"normal": 1.0, "tiny": 1e-39, "huge": 1e30, "specials": 10.0, "zeros": 0.0}[family]
    if family == "specials" and x.size:
        flat = x.reshape(-1)
        flat[prng.integers(0, flat.size, 3)] = [np.nan, np.inf, -np.inf]
    with np.errstate(over="ignore"):
        return x.astype(NUMPY_DTYPES[dtype])

