"""Policy losses: PPO-clip / KL / TIS values and gradients vs a float64 numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toolverse_jax.rl.losses import TrainBatch, aggregate, get_loss, kl_k3
from toolverse_jax.rl.trainer import LossConfig


def _batch(rng, b=3, l=5):
    f = lambda *s: rng.normal(size=s).astype(np.float32)
    mask = (rng.random((b, l)) > 0.3).astype(np.float32)
    mask[0, :] = 1
    old = -np.abs(f(b, l))
    return TrainBatch(tokens=np.zeros((b, l), np.int32), targets=np.zeros((b, l), np.int32),
                      segment_ids=np.ones((b, l), np.int32), positions=np.zeros((b, l), np.int32),
                      loss_mask=mask, advantages=f(b, l), sample_logprobs=old + 0.05 * f(b, l),
                      old_logprobs=old, ref_logprobs=old + 0.1 * f(b, l))


def _numpy_ppo(lp, batch, cfg):
    lp = lp.astype(np.float64)
    old = batch.old_logprobs.astype(np.float64)
    ratio = np.exp(lp - old)
    adv = batch.advantages.astype(np.float64)
    adv = np.where(adv < 0, cfg.neg_adv_scale * adv, adv)
    clipped = np.clip(ratio, 1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
    per = -np.minimum(ratio * adv, clipped * adv)
    w = np.minimum(np.exp(old - batch.sample_logprobs), cfg.tis_cap)
    per = per * w
    m = batch.loss_mask
    loss = (per * m).sum() / m.sum()
    r = batch.ref_logprobs - lp
    kl = ((np.exp(r) - r - 1) * m).sum() / m.sum()
    return loss + cfg.kl_coef * kl


@pytest.mark.parametrize("kl_coef,neg_adv_scale", [(0.0, 1.0), (0.05, 1.0), (0.0, 0.25)])
def test_ppo_clip_value_and_grad_match_numpy(kl_coef, neg_adv_scale):
    rng = np.random.default_rng(0)
    batch = _batch(rng)
    cfg = LossConfig(clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=kl_coef, tis_cap=1.5,
                     neg_adv_scale=neg_adv_scale)
    lp = batch.old_logprobs + 0.4 * rng.normal(size=batch.old_logprobs.shape).astype(np.float32)
    fn = get_loss("ppo_clip")
    loss, metrics = fn(jnp.asarray(lp), jnp.zeros_like(lp), batch, cfg)
    np.testing.assert_allclose(float(loss), _numpy_ppo(lp, batch, cfg), rtol=1e-5)
    grad = jax.grad(lambda x: fn(x, jnp.zeros_like(x), batch, cfg)[0])(jnp.asarray(lp))
    # Central differences on the float64 reference.
    h, num = 1e-5, np.zeros_like(lp, np.float64)
    for idx in np.ndindex(lp.shape):
        up, dn = lp.astype(np.float64).copy(), lp.astype(np.float64).copy()
        up[idx] += h
        dn[idx] -= h
        num[idx] = (_numpy_ppo(up, batch, cfg) - _numpy_ppo(dn, batch, cfg)) / (2 * h)
    np.testing.assert_allclose(np.asarray(grad), num, atol=2e-5)
    assert 0.0 <= float(metrics["clip_frac"]) <= 1.0
    assert float(metrics["logprob_diff_max"]) > 0


def test_clipping_stops_gradient_outside_trust_region():
    b = _batch(np.random.default_rng(1))
    b = b._replace(advantages=np.ones_like(b.advantages), loss_mask=np.ones_like(b.loss_mask))
    lp = b.old_logprobs + 1.0  # ratio e > 1 + eps: clipped with positive advantage
    g = jax.grad(lambda x: get_loss("ppo_clip")(x, x * 0, b, LossConfig(tis_cap=0))[0])(lp)
    assert float(jnp.max(jnp.abs(g))) == 0.0


def test_kl_k3_nonnegative_and_zero_at_equality():
    x = jnp.linspace(-3, 3, 11)
    assert float(jnp.min(kl_k3(x, x[::-1]))) >= 0
    assert float(jnp.max(jnp.abs(kl_k3(x, x)))) == 0


def test_aggregation_modes():
    x = jnp.array([[1.0, 3.0, 0.0], [10.0, 0.0, 0.0]])
    m = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert float(aggregate(x, m, "token_mean")) == pytest.approx(14 / 3)
    assert float(aggregate(x, m, "seq_mean")) == pytest.approx((2 + 10) / 2)
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(x, m, "sum")
    with pytest.raises(KeyError, match="registered"):
        get_loss("nope")


def test_sft_loss_is_masked_nll():
    b = _batch(np.random.default_rng(2))
    lp = jnp.asarray(b.old_logprobs)
    loss, _ = get_loss("sft")(lp, lp * 0, b, LossConfig())
    m = b.loss_mask
    assert float(loss) == pytest.approx(float(-(b.old_logprobs * m).sum() / m.sum()), rel=1e-6)
