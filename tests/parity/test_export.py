"""torch.export save -> load -> run gives the eager bytes (quantizer specs serialize; dynamic
batch), and jax.export serialize -> deserialize -> call gives the jitted bytes (needs the
flatbuffers dependency)."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, from_torch

import twinengine as te
import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine import recipe as R

RECIPES = {"mxfp8": R.MXFP8BlockScaling(), "delayed": R.DelayedScaling(amax_history_len=4),
           "nvfp4": R.NVFP4BlockScaling(), "high_precision": None}


class _Model(torch.nn.Module):
    def __init__(self, recipe):
        super().__init__()
        torch.manual_seed(0)
        self.recipe = recipe
        self.a = tep.Linear(64, 64, amax_history_len=4, params_dtype=torch.bfloat16)

    def forward(self, x):
        with tep.autocast(self.recipe, enabled=self.recipe is not None):
            qt = tep.quantize(self.a(x), te.MXFP8Quantizer("e4m3"))
        return tep.dequantize(qt, torch.float32)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_torch_export_save_load_run_same_bytes_dynamic_batch(name):
    x = torch.randn(64, 64).to(torch.bfloat16)
    batch = torch.export.Dim("batch", min=1, max=1024) * 32
    with torch.no_grad():
        ep = torch.export.export(_Model(RECIPES[name]), (x,), dynamic_shapes={"x": {0: batch}})
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    loaded, eager = torch.export.load(buf).module(), _Model(RECIPES[name])
    for rows in (64, 96, 64):  # dynamic batch; stateful recipes advance the same state in both
        xi = torch.randn(rows, 64).to(torch.bfloat16)
        with torch.no_grad():
            assert_bytes_equal(from_torch(loaded(xi)), from_torch(eager(xi)), f"{name} rows={rows}")
    for buffer_name, value in eager.a.named_buffers():
        assert_bytes_equal(from_torch(loaded.get_buffer(f"a.{buffer_name}")), from_torch(value), buffer_name)


@pytest.mark.parametrize("q", [te.MXFP8Quantizer("e4m3"), te.NVFP4Quantizer(with_rht=True)],
                         ids=lambda q: q.scaling_mode)
def test_jax_export_serialize_deserialize_call(q):
    kernel = jnp.asarray(np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32), jnp.bfloat16)

    def f(x):
        y = tej.dense(x, kernel, recipe=R.MXFP8BlockScaling())
        qt = tej.quantize(y.reshape(-1, 32), q)
        return tej.dequantize(qt, jnp.float32), qt.rowwise_data

    x = jnp.asarray(np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32), jnp.bfloat16)
    exported = jax.export.export(jax.jit(f), disabled_checks=tej.export_disabled_checks())(
        jax.ShapeDtypeStruct(x.shape, x.dtype))
    restored = jax.export.deserialize(exported.serialize())
    for got, want in zip(restored.call(x), jax.jit(f)(x)):
        assert_bytes_equal(np.asarray(got), np.asarray(want), "jax.export round trip")
