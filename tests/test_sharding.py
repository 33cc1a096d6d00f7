"""Sharded init/forward/backward on 8 fake CPU devices equals the single-device model."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from tests.multidevice import run_with_devices
from toolverse_jax.sharding import logical_to_spec, make_mesh

_CODE = """
import jax, jax.numpy as jnp, numpy as np
from toolverse_jax.models import get_preset, init_params, logits
from toolverse_jax.sharding import (batch_sharding, init_sharded_params, make_mesh, shard_params,
                                    sharding_context)
assert len(jax.devices()) == 8
cfg = get_preset("tiny")
params = init_params(cfg, jax.random.key(0))
tokens = jax.random.randint(jax.random.key(1), (8, 16), 0, cfg.vocab_size)
loss = lambda p, t: jnp.mean(jax.nn.log_softmax(logits(p, cfg, t))[..., 0])
ref = jax.jit(lambda p, t: logits(p, cfg, t))(params, tokens)  # one device; jitted, not eager
ref_grad = jax.jit(jax.grad(loss))(params, tokens)
for shape in [(8, 1, 1), (2, 2, 2), (1, 2, 4)]:
    mesh = make_mesh(shape)
    with sharding_context(mesh):
        sp = shard_params(params, cfg, mesh)
        t = jax.device_put(tokens, batch_sharding(mesh, 2))
        out = jax.jit(lambda p, t: logits(p, cfg, t))(sp, t)
        grad = jax.jit(jax.grad(loss))(sp, t)
        fresh = init_sharded_params(cfg, jax.random.key(0), mesh)
    assert len(out.sharding.device_set) == 8
    err = float(jnp.max(jnp.abs(out - ref)))
    gerr = max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad)))
    ierr = max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree.leaves(fresh), jax.tree.leaves(params)))
    print("RESULT", shape, err, gerr, ierr, sp["layers_0"]["mlp"]["gate_proj"].sharding.spec)
"""


@pytest.mark.multidevice
def test_sharded_logits_and_grads_match_single_device():
    out = run_with_devices(_CODE, 8)
    rows = [line.split() for line in out.splitlines() if line.startswith("RESULT")]
    assert len(rows) == 3
    for row in rows:
        err, gerr, ierr = (float(x) for x in row[4:7])
        assert err <= 1e-5, row
        assert gerr <= 1e-5, row
        assert ierr <= 1e-6, row  # same random draws; erf-inverse rounding differs by ulps


_MOE_CODE = """
import jax, jax.numpy as jnp, numpy as np, optax
from toolverse_jax.models import get_preset, init_params, logits
from toolverse_jax.sharding import batch_sharding, make_mesh, shard_params, sharding_context
assert len(jax.devices()) == 8
cfg = get_preset("qwen3-30b-a3b").replace(
    num_layers=2, d_model=32, vocab_size=64, num_heads=4, num_kv_heads=2, head_dim=8,
    num_experts=8, num_experts_per_tok=2, moe_mlp_dim=16, dtype="float32", param_dtype="float32")
params = init_params(cfg, jax.random.key(0))
tokens = jax.random.randint(jax.random.key(1), (8, 16), 0, cfg.vocab_size)
loss = lambda p, t: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits(p, cfg, t[:, :-1])), t[:, 1:, None], -1))
opt = optax.adamw(1e-2)
def step(p, s, t):
    l, g = jax.value_and_grad(loss)(p, t)
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s, l, g
ref_p, _, ref_l, ref_g = jax.jit(step)(params, opt.init(params), tokens)  # one device
for shape in [(2, 1, 4), (1, 2, 4), (2, 2, 2)]:
    mesh = make_mesh(shape)
    with sharding_context(mesh):
        sp = shard_params(params, cfg, mesh)
        t = jax.device_put(tokens, batch_sharding(mesh, 2))
        new_p, _, l, g = jax.jit(step)(sp, opt.init(sp), t)
    spec = sp["layers_0"]["moe"]["gate_proj"].sharding.spec
    gerr = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref_g)))
    perr = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(new_p), jax.tree.leaves(ref_p)))
    print("RESULT", shape, abs(float(l - ref_l)), gerr, perr, spec[0])
"""


@pytest.mark.multidevice
def test_moe_train_step_sharded_over_experts_matches_single_device():
    # Qwen3-MoE at toy size: loss, grads and one AdamW update under three meshes, expert dim of
    # the expert weights split over the tensor axis ("expert" logical rule).
    out = run_with_devices(_MOE_CODE, 8)
    rows = [line.split() for line in out.splitlines() if line.startswith("RESULT")]
    assert len(rows) == 3
    for row in rows:
        lerr, gerr, perr = (float(x) for x in row[4:7])
        assert lerr <= 1e-5 and gerr <= 1e-5 and perr <= 1e-5, row
        assert row[7] == "tensor", row


def test_logical_rules_and_indivisible_dims():
    mesh = make_mesh((1, 1, 1))
    assert logical_to_spec(("embed", "mlp"), (64, 128), mesh) == P(None, None)
    fake = type("M", (), {"shape": {"data": 2, "fsdp": 2, "tensor": 4}})()
    assert logical_to_spec(("embed", "mlp"), (64, 128), fake) == P("fsdp", "tensor")
    assert logical_to_spec(("embed", "kv", "head_dim"), (64, 2, 16), fake) == P("fsdp", None, None)
    assert logical_to_spec(("batch", "length"), (8, 5), fake) == P(("data", "fsdp"), None)
    assert logical_to_spec(("expert", "embed", "moe_mlp"), (8, 64, 16), fake) == P(
        "tensor", "fsdp", None)
    with pytest.raises(ValueError, match="needs 8 devices"):
        make_mesh((2, 2, 2), devices=jax.devices())
    with pytest.raises(ValueError, match="unknown axes"):
        make_mesh({"model": 1})
