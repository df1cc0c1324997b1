"""API frictions: tep.autocast(recipe) positional, meta-device Linear + to_empty, int64 routing
maps (what torch.topk / one_hot return) in the MoE ops of both frontends."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import assert_bytes_equal, from_torch

import twinengine.jax as tej
import twinengine.pytorch as tep
from twinengine import recipe as R


def test_autocast_takes_the_recipe_positionally_in_both_frontends():
    r = R.MXFP8BlockScaling()
    layer = tep.Linear(64, 64)
    x = torch.randn(32, 64)
    with tep.autocast(r):
        positional = layer(x)
    with tep.autocast(recipe=r):
        keyword = layer(x)
    with tep.autocast(r, enabled=False):
        disabled = layer(x)
    assert torch.equal(positional, keyword) and not torch.equal(positional, disabled)
    assert torch.equal(disabled, layer(x))
    with tej.autocast(r):  # the same signature in JAX
        pass


def test_meta_device_linear_to_empty_then_reset_parameters_equals_a_direct_build():
    torch.manual_seed(3)
    direct = tep.Linear(64, 32, amax_history_len=8, rng_seed=11)
    meta = tep.Linear(64, 32, amax_history_len=8, rng_seed=11, device="meta")
    assert all(t.is_meta for t in list(meta.parameters()) + list(meta.buffers()))
    meta.to_empty(device="cpu")
    torch.manual_seed(3)
    meta.reset_parameters()
    for (name, a), (_, b) in zip(direct.state_dict().items(), meta.state_dict().items()):
        assert_bytes_equal(from_torch(b), from_torch(a), name)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    with tep.autocast(R.NVFP4BlockScaling()):
        assert torch.equal(direct.to(torch.bfloat16)(x), meta.to(torch.bfloat16)(x))


@pytest.mark.parametrize("map_type", ["index", "mask"])
def test_int64_routing_maps_equal_int32_in_both_frontends(map_type):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 32)).astype(np.float32)
    logits = torch.from_numpy(rng.standard_normal((16, 4)).astype(np.float32))
    top = torch.topk(logits, 2, dim=-1).indices  # int64, as users have it
    if map_type == "index":
        routing64 = top
    else:
        routing64 = torch.nn.functional.one_hot(top, 4).sum(1)  # int64 mask
    assert routing64.dtype == torch.int64
    routing32 = routing64.to(torch.int32)
    n = 32
    out64, map64 = tep.moe_permute(torch.from_numpy(x), routing64, n, map_type)
    out32, map32 = tep.moe_permute(torch.from_numpy(x), routing32, n, map_type)
    assert torch.equal(out64, out32) and torch.equal(map64, map32)
    jout, jmap = tej.moe_permute(jnp.asarray(x), jnp.asarray(routing32.numpy()), n, map_type)
    assert_bytes_equal(np.asarray(jout), from_torch(out64), "jax vs torch int64 map")
    compiled = torch.compile(lambda a, m: tep.moe_permute(a, m, n, map_type)[0], fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(torch.from_numpy(x), routing64), out32)


def test_int64_index_map_past_int32_is_a_clear_error():
    x = torch.ones(4, 8)
    routing = torch.tensor([[0], [1], [2], [2**31]], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"twinengine.moe_permute: routing_map holds expert id 2147483648; "
                                         r"expert ids must be < 2\*\*31"):
        tep.moe_permute(x, routing, 4, "index")
