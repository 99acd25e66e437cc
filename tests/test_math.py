"""The shared harness: every script's compute_gae and ppo_loss against reference values."""
import numpy as np
import pytest
import torch

from conftest import load_script, pooled_variance

T = torch.tensor


# ------------------------------------------------------------------------------------------ compute_gae
def gae_by_hand_case():
    """Two envs, three steps, gamma = lambda = 0.5, so gamma * lambda = 0.25.

    env 0: rewards 1, 0, 2; values 0.5, 1, 0.5; dones 0, 0, 1 (step 1 ended an episode, obs 2 starts a new one);
           next_value 2, next_done 0 (bootstrap from V = 2 after the last step).
      t=2: delta = 2 + 0.5*2*1 - 0.5  =  2.5             A =  2.5
      t=1: delta = 0 + 0.5*0.5*0 - 1  = -1   (episode end) A = -1 + 0.25*0*2.5 = -1
      t=0: delta = 1 + 0.5*1 - 0.5   =  1                 A =  1 + 0.25*(-1)    = 0.75
      returns = A + V = 1.25, 0, 3
    env 1: rewards 0, 0, 1; values 1, 1, 1; dones 0, 0, 0; next_value 4, next_done 1 (the last step ended an
           episode, so next_value must not be used).
      t=2: delta = 1 + 0 - 1          =  0                 A =  0
      t=1: delta = 0 + 0.5*1 - 1      = -0.5               A = -0.5 + 0.25*0     = -0.5
      t=0: delta = 0 + 0.5*1 - 1      = -0.5               A = -0.5 + 0.25*(-0.5) = -0.625
      returns = 0.375, 0.5, 1
    """
    rewards = T([[1.0, 0.0], [0.0, 0.0], [2.0, 1.0]])
    values = T([[0.5, 1.0], [1.0, 1.0], [0.5, 1.0]])
    dones = T([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    next_value, next_done = T([2.0, 4.0]), T([0.0, 1.0])
    advantages = T([[0.75, -0.625], [-1.0, -0.5], [2.5, 0.0]])
    returns = T([[1.25, 0.375], [0.0, 0.5], [3.0, 1.0]])
    return (rewards, values, dones, next_value, next_done, 0.5, 0.5), advantages, returns


def gae_plain_loop(rewards, values, dones, next_value, next_done, gamma, lam):
    """An independent reference: plain Python floats, one env at a time, straight from the definition."""
    T_, N = len(rewards), len(rewards[0])
    adv = [[0.0] * N for _ in range(T_)]
    for n in range(N):
        a = 0.0
        for t in reversed(range(T_)):
            v_next = float(next_value[n]) if t == T_ - 1 else float(values[t + 1][n])
            done_next = float(next_done[n]) if t == T_ - 1 else float(dones[t + 1][n])
            delta = float(rewards[t][n]) + gamma * v_next * (1 - done_next) - float(values[t][n])
            a = delta + gamma * lam * (1 - done_next) * a
            adv[t][n] = a
    return T(adv), T(adv) + values


def test_gae_by_hand(script):
    inputs, advantages, returns = gae_by_hand_case()
    adv, ret = script.compute_gae(*inputs)
    torch.testing.assert_close(adv, advantages)
    torch.testing.assert_close(ret, returns)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_against_plain_loop(script, seed):
    g = torch.Generator().manual_seed(seed)
    T_, N = 17, 5
    rewards, values = torch.randn(T_, N, generator=g), torch.randn(T_, N, generator=g)
    dones = (torch.rand(T_, N, generator=g) < 0.2).float()
    next_value, next_done = torch.randn(N, generator=g), (torch.rand(N, generator=g) < 0.5).float()
    inputs = (rewards, values, dones, next_value, next_done, 0.97, 0.9)
    copies = [x.clone() for x in inputs[:5]]
    adv, ret = script.compute_gae(*inputs)
    ref_adv, ref_ret = gae_plain_loop(*inputs)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-5, atol=1e-5)
    assert adv.dtype == ret.dtype == torch.float32 and adv.shape == ret.shape == (T_, N)
    for before, after in zip(copies, inputs[:5]):
        assert torch.equal(before, after), "compute_gae changed one of its inputs"


def test_gae_lambda_one_is_discounted_return(script):
    # With lambda = 1 and no episode end, the return is the plain discounted sum bootstrapped with next_value.
    rewards, values = T([[1.0], [2.0], [3.0]]), T([[9.0], [-4.0], [0.5]])
    _, ret = script.compute_gae(rewards, values, torch.zeros(3, 1), T([10.0]), T([0.0]), 0.9, 1.0)
    torch.testing.assert_close(ret[0], T([1 + 0.9 * 2 + 0.81 * 3 + 0.729 * 10]))


# ------------------------------------------------------------------------------------------ ppo_loss
def loss_inputs(ratio, advantage, newvalue=1.0, oldvalue=1.0, ret=1.0, entropy=0.0):
    """One-element minibatch with the given probability ratio; newlogprob requires grad."""
    newlogprob = torch.tensor([0.3 + float(torch.log(torch.tensor(ratio)))], requires_grad=True)
    return dict(newlogprob=newlogprob, oldlogprob=T([0.3]), advantages=T([advantage]),
                newvalue=T([newvalue]), oldvalue=T([oldvalue]), returns=T([ret]), entropy=T([entropy]))


def call_loss(script, inputs, clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, clip_vloss=True):
    return script.ppo_loss(inputs["newlogprob"], inputs["oldlogprob"], inputs["advantages"], inputs["newvalue"],
                           inputs["oldvalue"], inputs["returns"], inputs["entropy"], clip_coef, vf_coef, ent_coef,
                           clip_vloss)


def test_loss_at_ratio_one(script):
    g = torch.Generator().manual_seed(0)
    logp, adv = torch.randn(64, generator=g), torch.randn(64, generator=g)
    value, ret, ent = torch.randn(64, generator=g), torch.randn(64, generator=g), torch.rand(64, generator=g)
    loss, stats = script.ppo_loss(logp, logp.clone(), adv, value, value.clone(), ret, ent, 0.1, 0.5, 0.01)
    v_loss = 0.5 * ((value - ret) ** 2).mean()
    torch.testing.assert_close(stats["pg_loss"], -adv.mean())
    torch.testing.assert_close(stats["v_loss"], v_loss)
    torch.testing.assert_close(loss, -adv.mean() - 0.01 * ent.mean() + 0.5 * v_loss)
    assert float(stats["approx_kl"]) == 0.0 and float(stats["clipfrac"]) == 0.0
    torch.testing.assert_close(torch.as_tensor(stats["entropy"]), ent.mean())


@pytest.mark.parametrize("ratio,advantage,expected_pg,clipped", [
    (1.5, 2.0, -1.2 * 2.0, True),    # good action made much likelier: gain capped at 1 + c, no gradient
    (0.5, -2.0, 0.8 * 2.0, True),    # bad action made much rarer: gain capped at 1 - c, no gradient
    (0.5, 2.0, -0.5 * 2.0, False),   # good action made rarer: the pessimistic (unclipped) term applies
    (1.5, -2.0, 1.5 * 2.0, False),   # bad action made likelier: unclipped, the loss keeps growing
    (1.1, 2.0, -1.1 * 2.0, False),   # inside the clip range
])
def test_policy_clipping(script, ratio, advantage, expected_pg, clipped):
    inputs = loss_inputs(ratio, advantage)
    loss, stats = call_loss(script, inputs, clip_coef=0.2, vf_coef=0.0, ent_coef=0.0)
    torch.testing.assert_close(stats["pg_loss"], torch.tensor(expected_pg))
    loss.backward()
    grad = float(inputs["newlogprob"].grad)
    if clipped:
        assert grad == 0.0
    else:  # d(-A * ratio)/d(logprob) = -A * ratio
        assert grad == pytest.approx(-advantage * ratio, rel=1e-5)
    assert float(stats["clipfrac"]) == (1.0 if abs(ratio - 1) > 0.2 else 0.0)
    assert float(stats["approx_kl"]) == pytest.approx((ratio - 1) - torch.log(torch.tensor(ratio)).item(), rel=1e-4)


def test_annealed_clip_range(script):
    # The same ratio is clipped by a smaller (annealed) range and not by the full one; clipfrac follows. That
    # train() passes ppo_atari.py's annealed range to every minibatch is checked in test_cli.py.
    inputs = loss_inputs(1.08, 1.0)
    _, full = call_loss(script, inputs, clip_coef=0.1, vf_coef=0.0, ent_coef=0.0)
    _, annealed = call_loss(script, inputs, clip_coef=0.05, vf_coef=0.0, ent_coef=0.0)
    assert float(full["pg_loss"]) == pytest.approx(-1.08, rel=1e-5) and float(full["clipfrac"]) == 0.0
    assert float(annealed["pg_loss"]) == pytest.approx(-1.05, rel=1e-5) and float(annealed["clipfrac"]) == 1.0
    # ...and the value is clipped by the annealed range too: v moves 0.5 from v_old, clipped to 0.05.
    inputs = loss_inputs(1.0, 0.0, newvalue=1.5, oldvalue=1.0, ret=2.0)
    _, stats = call_loss(script, inputs, clip_coef=0.05)
    assert float(stats["v_loss"]) == pytest.approx(0.5 * (2.0 - 1.05) ** 2, rel=1e-5)


def test_value_clipping(script):
    # v_old = 1, v = 2, R = 2, c = 0.2: unclipped error 0, clipped value 1.2 has error 0.8; the max is taken.
    inputs = loss_inputs(1.0, 0.0, newvalue=2.0, oldvalue=1.0, ret=2.0)
    _, on = call_loss(script, inputs, clip_vloss=True)
    _, off = call_loss(script, inputs, clip_vloss=False)
    assert float(on["v_loss"]) == pytest.approx(0.5 * 0.8 ** 2, rel=1e-5)
    assert float(off["v_loss"]) == 0.0
    # When the new value is the worse one, clipping keeps the unclipped (larger) error.
    inputs = loss_inputs(1.0, 0.0, newvalue=0.0, oldvalue=1.0, ret=2.0)
    _, on = call_loss(script, inputs, clip_vloss=True)
    assert float(on["v_loss"]) == pytest.approx(0.5 * 2.0 ** 2, rel=1e-5)


def test_total_loss_and_stats(script):
    inputs = loss_inputs(1.0, 3.0, newvalue=0.0, oldvalue=0.0, ret=2.0, entropy=1.5)
    copies = {k: v.detach().clone() for k, v in inputs.items()}
    loss, stats = call_loss(script, inputs, clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, clip_vloss=False)
    assert float(loss.detach()) == pytest.approx(-3.0 - 0.01 * 1.5 + 0.5 * 0.5 * 4.0, rel=1e-5)
    assert set(stats) >= {"pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac"}
    for value in stats.values():
        assert not (isinstance(value, torch.Tensor) and (value.requires_grad or value.dim() != 0))
    for k, v in inputs.items():
        assert torch.equal(v.detach(), copies[k]), f"ppo_loss changed its input {k}"


# ----------------------------------------------------------------------------------- explained variance
def test_explained_variance(script):
    """1 - Var(R - V) / Var(R), by hand: R = 1, 2, 3, 6 (mean 3, Var 14/3 unbiased), R - V = 0, 0, 0, 2 (mean 0.5,
    Var 3/3 = 1), so 1 - 1 / (14/3) = 11/14. Where the returns do not vary, nan (never an infinity)."""
    values, returns = T([1.0, 2.0, 3.0, 4.0]), T([1.0, 2.0, 3.0, 6.0])
    assert script.explained_variance(values, returns) == pytest.approx(11 / 14)
    assert script.explained_variance(returns, returns) == pytest.approx(1.0)
    for values in (T([1.0, 2.0, 3.0, 4.0]), T([2.0, 2.0, 2.0, 2.0])):
        ev = script.explained_variance(values, T([2.0, 2.0, 2.0, 2.0]))
        assert isinstance(ev, float) and ev != ev  # nan


# ------------------------------------------------------------------------------ normalization statistics
@pytest.mark.parametrize("name", ["ppo_continuous", "ppo_lstm"])
@pytest.mark.parametrize("shape", [(3,), ()])  # observations, and the returns' one number
def test_running_norm_merges_batches_into_the_statistics_of_all_the_data(name, shape):
    """Batches of 7, 1 and 50 rows, far from mean 0 and variance 1, taken in one at a time: the mean and variance
    are those of all 58 rows pooled with the start (count 1e-4), computed in one go in float64; the count adds
    up; forward() shifts and scales by them and clips to [-10, 10]."""
    norm = load_script(name).RunningNorm(shape)
    rng = np.random.default_rng(0)
    batches = [rng.normal(5.0, 3.0, (n, *shape)) for n in (7, 1, 50)]
    for batch in batches:
        norm.update(torch.tensor(batch, dtype=torch.float32))
    data = [b.astype(np.float32) for b in batches]  # as the script gets them
    var, mean = pooled_variance(data)
    np.testing.assert_allclose(norm.mean.numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(norm.var.numpy(), var, rtol=1e-12)
    assert norm.count.item() == pytest.approx(58 + 1e-4, rel=1e-15)
    x = torch.full((2, *shape), 5.0)
    x[1] += 1e3  # far out: clipped
    expected = ((x.double() - torch.tensor(mean)) / torch.tensor(var + 1e-8).sqrt()).clamp(-10, 10).float()
    torch.testing.assert_close(norm(x), expected)
    assert norm(x).max() == 10
