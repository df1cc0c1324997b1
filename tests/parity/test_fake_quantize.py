"""fake_quantize: dequantize(quantize(x)) forward bytes with a straight-through gradient, the
same in torch eager, torch.compile, torch.func.grad, JAX and jax.jit(jax.grad)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, from_torch

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep

QUANTIZERS = [te.MXFP8Quantizer("e4m3"), te.Float8CurrentScalingQuantizer("e5m2"), te.NVFP4Quantizer(),
              te.Float8BlockQuantizer("e4m3", block_scaling_dim=1)]
X = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)
G = np.linspace(-3, 3, 128 * 128, dtype=np.float32).reshape(128, 128)


@pytest.mark.parametrize("q", QUANTIZERS, ids=lambda q: q.scaling_mode)
def test_fake_quantize_forward_bytes_and_straight_through_gradient(q):
    expected = tep.dequantize(tep.quantize(torch.from_numpy(X), q), torch.bfloat16)

    def loss(x):
        return (tep.fake_quantize(x, q, torch.bfloat16).float() * torch.from_numpy(G)).sum()

    x = torch.from_numpy(X).requires_grad_()
    y = tep.fake_quantize(x, q, torch.bfloat16)
    assert_bytes_equal(from_torch(y), from_torch(expected), "forward == dequantize(quantize(x))")
    loss(x).backward()
    grad_bf16 = torch.from_numpy(G).to(torch.bfloat16).float()  # dy is bf16 (y's dtype), cast to x's dtype
    assert_bytes_equal(from_torch(x.grad), from_torch(grad_bf16), "straight-through gradient")
    assert_bytes_equal(from_torch(torch.func.grad(loss)(torch.from_numpy(X))), from_torch(x.grad), "torch.func.grad")
    torch._dynamo.reset()
    xc = torch.from_numpy(X).requires_grad_()
    torch.compile(loss, fullgraph=True, backend="aot_eager")(xc).backward()
    assert_bytes_equal(from_torch(xc.grad), from_torch(x.grad), "compiled gradient")

    jloss = lambda v: (tej.fake_quantize(v, q, jnp.bfloat16).astype(jnp.float32) * G).sum()  # noqa: E731
    jy = tej.fake_quantize(jnp.asarray(X), q, jnp.bfloat16)
    assert_bytes_equal(np.asarray(jy), from_torch(y), "jax forward vs torch")
    assert_bytes_equal(np.asarray(jax.jit(jax.grad(jloss))(jnp.asarray(X))), from_torch(x.grad), "jax gradient")


@pytest.mark.parametrize("q", QUANTIZERS[:3], ids=lambda q: q.scaling_mode)
def test_dequantize_of_quantize_is_straight_through(q):
    # dequantize(quantize(x)) differentiates w.r.t. x like fake_quantize: same forward bytes,
    # gradient = incoming gradient cast to x's dtype; eager, torch.func.grad, compiled, JAX, jit.
    def loss(x):
        return (tep.dequantize(tep.quantize(x, q), torch.bfloat16).float() * torch.from_numpy(G)).sum()

    x = torch.from_numpy(X).requires_grad_()
    y = tep.dequantize(tep.quantize(x, q), torch.bfloat16)
    assert y.requires_grad
    assert_bytes_equal(from_torch(y), from_torch(tep.fake_quantize(torch.from_numpy(X), q, torch.bfloat16)), "fwd")
    loss(x).backward()
    grad_bf16 = torch.from_numpy(G).to(torch.bfloat16).float()
    assert_bytes_equal(from_torch(x.grad), from_torch(grad_bf16), "straight-through gradient")
    assert_bytes_equal(from_torch(torch.func.grad(loss)(torch.from_numpy(X))), from_torch(x.grad), "torch.func.grad")
    torch._dynamo.reset()
    xc = torch.from_numpy(X).requires_grad_()
    torch.compile(loss, fullgraph=True, backend="aot_eager")(xc).backward()
    assert_bytes_equal(from_torch(xc.grad), from_torch(x.grad), "compiled gradient")
    # No gradient link without autograd: a plain quantize keeps its fast path and yields a leaf.
    with torch.no_grad():
        assert not tep.dequantize(tep.quantize(x, q)).requires_grad

    jloss = lambda v: (tej.dequantize(tej.quantize(v, q), jnp.bfloat16).astype(jnp.float32) * G).sum()  # noqa: E731
    assert_bytes_equal(np.asarray(jax.grad(jloss)(jnp.asarray(X))), from_torch(x.grad), "jax gradient")
    assert_bytes_equal(np.asarray(jax.jit(jax.grad(jloss))(jnp.asarray(X))), from_torch(x.grad), "jit(grad)")


def test_columnwise_rht_copy_has_no_straight_through_gradient():
    # The columnwise NVFP4 copy made with RHT decodes to transformed values: no identity
    # gradient exists, so differentiating through it raises rather than returning a wrong one.
    q = te.NVFP4Quantizer(with_rht=True, columnwise=True)
    xb = torch.from_numpy(X).to(torch.bfloat16)
    x = xb.clone().requires_grad_()
    y = tep.dequantize(tep.quantize(x, q), columnwise=True)
    assert not y.requires_grad
    with pytest.raises(RuntimeError):
        y.sum().backward()
