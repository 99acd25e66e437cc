"""The one small function that ppo_lstm.py and ppo_evolve.py share to turn the actor's output into a
distribution over any action space, checked against torch.distributions built another way: one distribution
per part of an action, their log-probabilities and entropies summed by hand."""
import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete, flatdim
from torch.distributions import Bernoulli, Categorical, Normal

from conftest import load_script

SPACES = {"Discrete": Discrete(5), "MultiDiscrete": MultiDiscrete([3, 5, 2]), "MultiBinary": MultiBinary(4),
          "Box": Box(-1.0, 2.0, (3,))}
SCRIPTS = ["ppo_lstm", "ppo_evolve"]
CASES = [(name, kind) for name in SCRIPTS for kind in SPACES]


def reference(space, output, logstd):
    """[(distribution, the action's columns)] for each part of an action, built without the script."""
    if isinstance(space, Discrete):
        return [(Categorical(logits=output), None)]
    if isinstance(space, MultiDiscrete):
        logits = output.split(space.nvec.tolist(), dim=-1)
        return [(Categorical(logits=part), i) for i, part in enumerate(logits)]
    if isinstance(space, MultiBinary):
        return [(Bernoulli(probs=torch.sigmoid(output[:, i])), i) for i in range(space.n)]
    return [(Normal(output[:, i], logstd[i].exp()), i) for i in range(space.shape[0])]


@pytest.mark.parametrize("name,kind", CASES)
def test_log_probability_entropy_and_greedy_action_of_each_space(name, kind):
    P = load_script(name)
    space = SPACES[kind]
    g = torch.Generator().manual_seed(0)
    output = torch.randn(64, flatdim(space), generator=g)  # the actor's output
    logstd = torch.randn(3, generator=g) if isinstance(space, Box) else None
    dist = P.action_distribution(space, output, logstd)
    action = dist.sample()
    parts = reference(space, output, logstd)
    column = lambda i: action if i is None else action[:, i]  # noqa: E731
    logprob = sum(d.log_prob(column(i)) for d, i in parts)
    entropy = sum(d.entropy() for d, i in parts)
    torch.testing.assert_close(dist.log_prob(action), logprob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dist.entropy(), entropy, rtol=1e-5, atol=1e-5)
    assert dist.log_prob(action).shape == dist.entropy().shape == (64,)  # one number per action
    greedy = dist.mode
    if isinstance(space, Box):
        torch.testing.assert_close(greedy, output)
    elif isinstance(space, MultiBinary):
        assert torch.equal(greedy, (output > 0).float())
    else:  # the likeliest choice in each part
        best = torch.stack([d.probs.argmax(-1) for d, i in parts], -1)
        assert torch.equal(greedy.reshape(best.shape).long(), best)


@pytest.mark.parametrize("name,kind", CASES)
def test_actions_reach_the_env_in_its_types_and_bounds(name, kind):
    P = load_script(name)
    space = SPACES[kind]
    sampled = torch.tensor(np.array([space.sample() for _ in range(32)]), dtype=torch.float32)
    if isinstance(space, Box):
        sampled = sampled * 3  # a Normal's samples leave the bounds; the env must get them clipped
    sent = P.to_env(space, sampled)
    assert sent.dtype == space.dtype and all(space.contains(a) for a in sent)
    if isinstance(space, Box):
        np.testing.assert_array_equal(sent, np.clip(sampled.numpy(), space.low, space.high))


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_discrete_space_that_starts_elsewhere_gets_its_offset(name):
    P = load_script(name)
    space = Discrete(3, start=1)  # actions 1, 2, 3; the Categorical draws 0, 1, 2
    assert P.to_env(space, torch.tensor([0.0, 2.0])).tolist() == [1, 3]
