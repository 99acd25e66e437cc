"""Tasks of the tests' own, named as a user names theirs: `--env-id tiny_tasks:MatchMultiBinary-v0`, with this
folder on the path. Importing this module registers them with gymnasium."""
import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete, Tuple


class Match(gym.Env):
    """Each step shows a target action, one-hot per part, as a flat Box observation; the reward is the share
    of the action's parts that equal the target's. A random policy earns about 1/2 a step on 4 bits and 0.29
    on MultiDiscrete([3, 4]); one that reads its observation earns 1. Episodes last 16 steps."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, action_space, render_mode=None):
        self.action_space = action_space
        self.observation_space = Box(0.0, 1.0, (gym.spaces.flatdim(action_space),), np.float32)
        self.render_mode = render_mode

    def _show(self):
        self.target = self.action_space.sample()
        return gym.spaces.flatten(self.action_space, self.target).astype(np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.action_space.seed(int(self.np_random.integers(2**31)))
        return self._show(), {}

    def step(self, action):
        assert self.action_space.contains(action), f"{action!r} is not in {self.action_space}"
        reward = float(np.mean(np.asarray(action) == self.target))
        return self._show(), reward, False, False, {}

    def render(self):
        return np.zeros((32, 32, 3), np.uint8)


class TupleActions(Match):
    """A task whose actions no script here handles: a Tuple of two Discrete spaces."""

    def __init__(self, render_mode=None):
        super().__init__(Discrete(2), render_mode)
        self.action_space = Tuple([Discrete(2), Discrete(3)])


class Reach(gym.Env):
    """A task as a user may write one, with Box actions: its constructor takes no render_mode, and it is
    registered with no time limit, so its episodes never end on their own. Each step shows a target point in
    [-1, 1]^2; the action is a point, and the reward minus their distance: a random policy that samples actions
    near 0 earns about -0.8 a step, one that reads its observation 0."""

    def __init__(self):
        self.observation_space = Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.target = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.target, {}

    def step(self, action):
        reward = -float(np.linalg.norm(np.asarray(action) - self.target))
        self.target = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self.target, reward, False, False, {}


class Broken(Match):
    """A task with a bug: its 100th step raises, as a user's own task might."""

    def __init__(self, render_mode=None):
        super().__init__(Discrete(2), render_mode)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 100:
            raise RuntimeError("the task broke")
        return super().step(action)


gym.register("MatchMultiBinary-v0", lambda **kw: Match(MultiBinary(4), **kw), max_episode_steps=16)
gym.register("MatchMultiDiscrete-v0", lambda **kw: Match(MultiDiscrete([3, 4]), **kw), max_episode_steps=16)
gym.register("MatchDiscreteFrom1-v0", lambda **kw: Match(Discrete(3, start=1), **kw), max_episode_steps=16)
gym.register("TupleActions-v0", TupleActions, max_episode_steps=16)
gym.register("MatchForever-v0", lambda **kw: Match(Discrete(2), **kw))  # no time limit
gym.register("Reach-v0", Reach)  # no time limit
gym.register("Broken-v0", Broken, max_episode_steps=16)


class ReachAnywhere(Reach):
    """Reach with unbounded actions, as a task may declare them: no bounds for tanh to squash into."""

    def __init__(self):
        super().__init__()
        self.action_space = Box(-np.inf, np.inf, (2,), np.float32)


gym.register("ReachAnywhere-v0", ReachAnywhere, max_episode_steps=16)


class ScalarBox(Reach):
    """Reach with a Box action of shape (): one number, not a vector of one."""

    def __init__(self):
        super().__init__()
        self.action_space = Box(-1.0, 1.0, (), np.float32)


gym.register("ScalarBox-v0", ScalarBox, max_episode_steps=16)


class EndsAtItsLimit(Match):
    """Match with two actions, whose episodes all reach the time limit of 16 steps: the 16th is truncated, and
    terminated as well where its action is 0, so that an episode ends by truncation alone or by both at once
    (which is termination: no bootstrap)."""

    def __init__(self, render_mode=None):
        super().__init__(Discrete(2), render_mode)

    def reset(self, seed=None, options=None):
        self.steps = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, self.steps == 16 and action == 0, truncated, info


gym.register("EndsAtItsLimit-v0", EndsAtItsLimit, max_episode_steps=16)


class ReachAlongALine(Reach):
    """Reach whose second action dimension has bounds of zero width: nothing for tanh to map onto."""

    def __init__(self):
        super().__init__()
        self.action_space = Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 0.0], np.float32))


gym.register("ReachAlongALine-v0", ReachAlongALine, max_episode_steps=16)
