"""twinengine.jax.grouped_dense and flax GroupedDense: each group's rows give exactly the bytes of
twinengine.jax.dense on those rows (forward and gradients), jitted with traced group sizes (no
recompile for a new split), degenerate splits and bad inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import NUMPY_DTYPES, assert_bytes_equal

import twinengine as te
import twinengine.jax as tej


def _case(splits, dtype, seed=0, K=48, N=24):
    rng = np.random.default_rng(seed)
    d = NUMPY_DTYPES[dtype]
    M, G = sum(splits), len(splits)
    return (rng.standard_normal((M, K)).astype(np.float32).astype(d),
            (rng.standard_normal((G, K, N)) * 0.2).astype(np.float32).astype(d),
            rng.standard_normal((G, N)).astype(np.float32).astype(d),
            rng.standard_normal((M, N)).astype(np.float32).astype(d))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("splits", [[5, 0, 20, 3], [0, 0, 28, 0], [0, 0, 0, 0]], ids=str)
def test_grouped_dense_matches_per_group_dense(splits, dtype):
    x, k, b, dy = _case(splits, dtype)
    fn = jax.jit(tej.grouped_dense)
    y, vjp = jax.vjp(lambda x, k, b: fn(x, k, jnp.asarray(splits), b), x, k, b)
    dx, dk, db = vjp(dy)
    off = 0
    for g, size in enumerate(splits):
        rows = slice(off, off + size)
        yg, vjp_g = jax.vjp(lambda x, k, b: tej.dense(x, k, b), x[rows], k[g], b[g])
        dxg, dkg, dbg = vjp_g(dy[rows])
        assert_bytes_equal(np.asarray(y[rows]), np.asarray(yg), f"output {g}")
        assert_bytes_equal(np.asarray(dx[rows]), np.asarray(dxg), f"dgrad {g}")
        if size:
            assert_bytes_equal(np.asarray(dk[g]), np.asarray(dkg), f"wgrad {g}")
            assert_bytes_equal(np.asarray(db[g]), np.asarray(dbg), f"bias grad {g}")
        else:
            assert not np.asarray(dk[g]).astype(np.float32).any() and not np.asarray(db[g]).astype(np.float32).any()
        off += size


def test_grouped_dense_jit_does_not_recompile_for_new_splits():
    x, k, b, _ = _case([10, 10, 10, 10], "float32")
    traces = []

    @jax.jit
    def fn(x, k, s, b):
        traces.append(1)
        return tej.grouped_dense(x, k, s, b)

    for splits in ([10, 10, 10, 10], [0, 40, 0, 0], [3, 0, 30, 7]):
        fn(x, k, jnp.asarray(splits, jnp.int32), b).block_until_ready()
    assert len(traces) == 1


def test_flax_grouped_dense_matches_function():
    from twinengine.jax.flax import GroupedDense
    x, _, _, _ = _case([3, 4, 5], "float32")
    module = GroupedDense(num_gemms=3, features=24)
    splits = jnp.asarray([3, 4, 5])
    params = module.init(jax.random.PRNGKey(0), x, splits)
    assert params["params"]["kernel"].shape == (3, 48, 24) and params["params"]["bias"].shape == (3, 24)
    y = jax.jit(module.apply)(params, x, splits)
    expected = tej.grouped_dense(x, params["params"]["kernel"], splits, params["params"]["bias"])
    assert_bytes_equal(np.asarray(y), np.asarray(expected), "flax module")


@pytest.mark.parametrize("call, error, match", [
    (lambda: tej.grouped_dense(jnp.ones((6, 4)), jnp.ones((2, 4, 2)), jnp.asarray([4, 3])), ValueError,
     "m_splits must sum to the 6 rows of the input, got sum 7"),
    (lambda: tej.grouped_dense(jnp.ones((6, 4)), jnp.ones((2, 4, 2)), jnp.asarray([4, 1])), ValueError,
     "m_splits must sum to the 6 rows of the input, got sum 5"),
    (lambda: tej.grouped_dense(jnp.ones((6, 4)), jnp.ones((2, 4, 2)), jnp.asarray([8, -2])), ValueError,
     "m_splits must be >= 0"),
    (lambda: tej.grouped_dense(jnp.ones((6, 4)), jnp.ones((3, 4, 2)), jnp.asarray([3, 3])), ValueError,
     "expected 2 weights \\(one per GEMM\\), got 3"),
])
def test_grouped_dense_rejects_bad_arguments(call, error, match):
    with pytest.raises(error, match=f"twinengine.grouped_linear: {match}"):
        call()


def test_grouped_dense_jitted_split_sum_is_checked_by_the_kernel():
    """Under jit the group sizes are traced (no host sync): the kernel reads them and fails the
    call with core's sentence (as an XLA runtime error)."""
    fn = jax.jit(tej.grouped_dense)
    x, k = jnp.ones((28, 48)), jnp.ones((4, 48, 24))
    fn(x, k, jnp.asarray([7, 7, 7, 7], jnp.int32)).block_until_ready()
    with pytest.raises(Exception, match="m_splits must sum to the 28 rows of the input, got sum 20"):
        fn(x, k, jnp.asarray([5, 0, 12, 3], jnp.int32)).block_until_ready()


def test_grouped_dense_under_an_unsupported_recipe_raises():
    with tej.autocast(te.recipe.MXFP8BlockScaling(enable_2d_quantization=True)):
        with pytest.raises(TypeError, match="twinengine.grouped_linear: GroupedLinear runs in high precision or with "
                                            "DelayedScaling, Float8CurrentScaling, 1D MXFP8BlockScaling, "
                                            "Float8BlockScaling or NVFP4BlockScaling"):
            tej.grouped_dense(jnp.ones((64, 32)), jnp.ones((2, 32, 32)), jnp.asarray([32, 32]))


def _assert_grouped_matches_per_group_dense(recipe, splits, x, k, b, dy, seed_offset=None):
    """Jitted grouped_dense under `recipe` (rng [seed, offset] when given) vs tej.dense on each
    group's rows (rng [seed, offset + g]): output, dgrad, wgrad and bias grad bytes; an empty
    group's kernel gradient is zero."""
    rng = None if seed_offset is None else jnp.asarray(seed_offset, jnp.int32)

    def grouped(x, k, b):
        with tej.autocast(recipe):
            return tej.grouped_dense(x, k, jnp.asarray(splits), b, rng=rng)

    y, vjp = jax.vjp(jax.jit(grouped), x, k, b)
    dx, dk, db = vjp(dy)
    off = 0
    for g, size in enumerate(splits):
        rows = slice(off, off + size)
        off += size
        if size == 0:
            assert not np.asarray(dk[g]).astype(np.float32).any()
            continue
        rng_g = None if rng is None else rng.at[1].add(g)
        yg, vjp_g = jax.vjp(lambda x, k, b: tej.dense(x, k, b, recipe=recipe, rng=rng_g), x[rows], k[g], b[g])
        dxg, dkg, dbg = vjp_g(dy[rows])
        for name, got, exp in (("output", y[rows], yg), ("dgrad", dx[rows], dxg), ("wgrad", dk[g], dkg),
                               ("bias grad", db[g], dbg)):
            assert_bytes_equal(np.asarray(got), np.asarray(exp), f"{name} {g}")


@pytest.mark.parametrize("dtype, splits, stochastic", [("bfloat16", [16, 0, 32, 16], True),
                                                       ("float32", [0, 0, 64, 0], True),
                                                       ("bfloat16", [32, 16, 0, 16], False)], ids=str)
def test_grouped_dense_nvfp4_matches_per_group_dense(dtype, splits, stochastic):
    """Each group quantized on its own (NVFP4 global amax, blocks, RHT for bf16, SR of the
    gradient with rng [seed, offset + g]): the bytes of tej.dense on its rows with that rng."""
    recipe = te.recipe.NVFP4BlockScaling(disable_stochastic_rounding=not stochastic)
    x, k, b, dy = _case(splits, dtype, seed=3, K=64, N=32)
    _assert_grouped_matches_per_group_dense(recipe, splits, x, k, b, dy, [9, 70] if stochastic else None)


def test_grouped_dense_nvfp4_needs_rng():
    with tej.autocast(te.recipe.NVFP4BlockScaling()):
        with pytest.raises(ValueError, match="needs rng="):
            tej.grouped_dense(jnp.ones((32, 32)), jnp.ones((2, 32, 16)), jnp.asarray([16, 16]))


def test_grouped_linear_basic_op_nvfp4_matches_grouped_dense():
    """jax ops.GroupedLinear under NVFP4 with rngs=[[seed, offset]] equals grouped_dense with
    rng=[seed, offset] (kernels = weightsᵀ), forward and gradients."""
    import twinengine.jax.ops as jops
    recipe = te.recipe.NVFP4BlockScaling()
    seq = jops.Sequential(jops.GroupedLinear(3, 32, 16))
    x, _, _, dy = _case([16, 0, 32], "bfloat16", seed=6, K=32, N=16)
    params = seq.init(jax.random.PRNGKey(2), jnp.bfloat16)
    splits, rng = jnp.asarray([16, 0, 32]), jnp.asarray([3, 8], jnp.int32)

    def seq_fn(x, p):
        with tej.autocast(recipe):
            return seq(x, p, splits, rngs=[rng])

    def fn(x, p):
        w, b = jnp.stack(p[0][:3]), jnp.stack(p[0][3:])
        with tej.autocast(recipe):
            return tej.grouped_dense(x, jnp.transpose(w, (0, 2, 1)), splits, b, rng=rng)

    results = []
    for f in (seq_fn, fn):
        y, vjp = jax.vjp(jax.jit(f), x, params)
        results.append([y, *jax.tree_util.tree_leaves(vjp(dy))])
    for j, (a, b) in enumerate(zip(*results)):
        assert_bytes_equal(np.asarray(a), np.asarray(b), f"result {j}")


@pytest.mark.parametrize("recipe_name, splits", [("Float8CurrentScaling", [5, 3, 20, 4]),
                                                 ("Float8CurrentScaling", [0, 0, 28, 0]),
                                                 ("MXFP8BlockScaling", [32, 0, 64, 32]),
                                                 ("Float8BlockScaling", [128, 0, 256, 128])], ids=str)
def test_grouped_dense_quantized_matches_per_group_dense(recipe_name, splits):
    recipe = getattr(te.recipe, recipe_name)()
    block = recipe_name == "Float8BlockScaling"
    x, k, b, dy = _case(splits, "bfloat16", seed=2, K=256 if block else 64, N=128 if block else 32)
    _assert_grouped_matches_per_group_dense(recipe, splits, x, k, b, dy)


def test_grouped_dense_delayed_scaling_matches_per_group_dense_over_steps():
    """Three jitted DelayedScaling steps with changing splits (one compile): each group's output,
    gradients and state slots equal tej.dense with its own state on its rows (empty groups
    included: their slots move on as a dense's on one zero row — input and grad amax 0)."""
    recipe = te.recipe.DelayedScaling(amax_history_len=4)
    G, K, N = 4, 32, 16

    def grouped(x, k, s, b, state):
        with tej.autocast(recipe):
            return tej.grouped_dense(x, k, s, b, state=state)

    def step(x, k, s, b, state, dy):
        (y, _), vjp = jax.vjp(lambda x, k, b, st: grouped(x, k, s, b, st), x, k, b, state)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, state)
        dx, dk, db, new_state = vjp((dy, zeros))
        return y, dx, dk, db, new_state

    def dense_step(x, k, b, state, dy):
        (y, _), vjp = jax.vjp(lambda x, k, b, st: tej.dense(x, k, b, recipe=recipe, state=st), x, k, b, state)
        return (y,) + vjp((dy, jax.tree_util.tree_map(jnp.zeros_like, state)))

    jitted = jax.jit(step)
    state = tej.grouped_delayed_scaling_state(G, 4)
    states = [tej.delayed_scaling_state(4) for _ in range(G)]
    _, k, b, _ = _case([28], "bfloat16", seed=3, K=K, N=N)
    k = jnp.stack([k[0] * (g + 1) for g in range(G)])
    b = jnp.stack([b[0]] * G)
    for i, splits in enumerate(([5, 3, 20, 4], [0, 0, 32, 0], [1, 13, 0, 18])):
        x, _, _, dy = _case(splits, "bfloat16", seed=10 + i, K=K, N=N)
        x = x * np.asarray(4.0 ** i, x.dtype)
        y, dx, dk, db, state = jitted(x, k, jnp.asarray(splits, jnp.int32), b, state, dy)
        off = 0
        for g, size in enumerate(splits):
            rows = slice(off, off + size)
            off += size
            if size == 0:  # its slots still move on with input and grad amax 0: dense on one zero row
                zero = np.zeros((1, K), x.dtype)
                *_, states[g] = dense_step(zero, k[g], b[g], states[g], np.zeros((1, N), dy.dtype))
                assert not np.asarray(dk[g]).astype(np.float32).any()
            else:
                yg, dxg, dkg, dbg, states[g] = dense_step(x[rows], k[g], b[g], states[g], dy[rows])
            for name, got, exp in (("output", y[rows], yg), ("dgrad", dx[rows], dxg), ("wgrad", dk[g], dkg),
                                   ("bias grad", db[g], dbg)) if size else ():
                assert_bytes_equal(np.asarray(got), np.asarray(exp), f"step {i} {name} {g}")
            for name, cols in (("fwd_amax_history", [g, G + g]), ("fwd_scale", [g, G + g]),
                               ("bwd_amax_history", [g]), ("bwd_scale", [g])):
                assert_bytes_equal(np.asarray(state[name][..., cols]), np.asarray(states[g][name]),
                                   f"step {i} {name} {g}")
    assert jitted._cache_size() == 1
    assert (np.asarray(state["fwd_scale"]) != 1).any()


def test_grouped_dense_delayed_scaling_needs_state():
    with tej.autocast(te.recipe.DelayedScaling(amax_history_len=4)):
        with pytest.raises(ValueError, match="twinengine.linear: DelayedScaling needs the layer's delayed-scaling"):
            tej.grouped_dense(jnp.ones((4, 16)), jnp.ones((2, 16, 16)), jnp.asarray([2, 2]))
        with pytest.raises(ValueError, match="twinengine.grouped_linear: the delayed-scaling state of a GroupedLinear "
                                             "of 2 GEMMs must have shapes"):
            tej.grouped_dense(jnp.ones((4, 16)), jnp.ones((2, 16, 16)), jnp.asarray([2, 2]),
                              state=tej.delayed_scaling_state(4))


def test_flax_grouped_dense_delayed_scaling_state_in_fp8_meta():
    """The Flax module keeps the per-expert DelayedScaling state in "fp8_meta": two training
    steps (next state = gradient wrt the collection) equal the functional grouped_dense's."""
    from twinengine.jax.flax import GroupedDense
    recipe = te.recipe.DelayedScaling(amax_history_len=4)
    x, _, _, dy = _case([8, 0, 24], "bfloat16", seed=5, K=32, N=16)
    splits = jnp.asarray([8, 0, 24])
    module = GroupedDense(num_gemms=3, features=16, param_dtype=jnp.bfloat16)
    with tej.autocast(recipe):
        variables = module.init(jax.random.PRNGKey(0), x, splits)
    params, meta = variables["params"], variables["fp8_meta"]
    assert meta["delayed_scaling"]["fwd_amax_history"].shape == (4, 6)

    def loss(params, meta):
        with tej.autocast(recipe):
            y = module.apply({"params": params, "fp8_meta": meta}, x, splits)
        return (y.astype(jnp.float32) * dy.astype(np.float32)).sum()

    def ref_loss(kernel, bias, state):
        with tej.autocast(recipe):
            y, _ = tej.grouped_dense(x, kernel, splits, bias, state=state)
        return (y.astype(jnp.float32) * dy.astype(np.float32)).sum()

    state = tej.grouped_delayed_scaling_state(3, 4)
    step = jax.jit(jax.grad(loss, argnums=(0, 1)))
    ref_step = jax.jit(jax.grad(ref_loss, argnums=(0, 1, 2)))
    for _ in range(2):
        (grads, meta) = step(params, meta)
        dk, db, state = ref_step(params["kernel"], params["bias"], state)
        assert_bytes_equal(np.asarray(grads["kernel"]), np.asarray(dk), "kernel grad")
        assert_bytes_equal(np.asarray(grads["bias"]), np.asarray(db), "bias grad")
        for name in state:
            assert_bytes_equal(np.asarray(meta["delayed_scaling"][name]), np.asarray(state[name]), name)
    assert (np.asarray(state["fwd_scale"]) != 1).any()


def test_grouped_linear_basic_op_matches_grouped_dense():
    """jax ops.GroupedLinear in a Sequential equals grouped_dense with kernels = weightsᵀ; under
    DelayedScaling it points to grouped_dense's per-expert state."""
    import twinengine.jax.ops as jops
    op = jops.GroupedLinear(3, 48, 24)
    seq = jops.Sequential(op)
    params = seq.init(jax.random.PRNGKey(1))
    x, _, _, _ = _case([3, 0, 9], "float32")
    splits = jnp.asarray([3, 0, 9])
    y = jax.jit(lambda x, p, s: seq(x, p, s))(x, params, splits)
    w = jnp.stack(params[0][:3])
    b = jnp.stack(params[0][3:])
    expected = tej.grouped_dense(x, jnp.transpose(w, (0, 2, 1)), splits, b)
    assert_bytes_equal(np.asarray(y), np.asarray(expected), "basic op")
    with tej.autocast(te.recipe.DelayedScaling(amax_history_len=4)):
        with pytest.raises(TypeError, match="twinengine.grouped_linear: DelayedScaling needs per-expert amax"):
            seq(x, params, splits)


def test_flax_grouped_dense_nvfp4_matches_function():
    """Flax GroupedDense under NVFP4: an explicit rng gives grouped_dense's bytes (forward and
    kernel gradient); without one it draws from the "stochastic_rounding" stream."""
    from twinengine.jax.flax import GroupedDense
    recipe = te.recipe.NVFP4BlockScaling()
    x, _, _, dy = _case([16, 0, 16], "bfloat16", seed=8, K=32, N=16)
    splits = jnp.asarray([16, 0, 16])
    rng = jnp.asarray([4, 11], jnp.uint32)
    module = GroupedDense(num_gemms=3, features=16, param_dtype=jnp.bfloat16)
    params = module.init(jax.random.PRNGKey(0), x, splits)["params"]

    def module_loss(p):
        with tej.autocast(recipe):
            return (module.apply({"params": p}, x, splits, rng).astype(jnp.float32) * dy.astype(np.float32)).sum()

    def fn_loss(kernel, bias):
        with tej.autocast(recipe):
            y = tej.grouped_dense(x, kernel, splits, bias, rng=rng)
        return (y.astype(jnp.float32) * dy.astype(np.float32)).sum()

    got = jax.grad(module_loss)(params)
    exp = jax.grad(fn_loss, argnums=(0, 1))(params["kernel"], params["bias"])
    assert_bytes_equal(np.asarray(got["kernel"]), np.asarray(exp[0]), "kernel grad")
    assert_bytes_equal(np.asarray(got["bias"]), np.asarray(exp[1]), "bias grad")
    with tej.autocast(recipe):  # the forward does not round stochastically: same bytes with a drawn rng
        drawn = module.apply({"params": params}, x, splits, rngs={"stochastic_rounding": jax.random.PRNGKey(1)})
        given = tej.grouped_dense(x, params["kernel"], splits, params["bias"], rng=rng)
    assert_bytes_equal(np.asarray(drawn), np.asarray(given), "forward with a drawn rng")
