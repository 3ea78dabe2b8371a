"""DQN on gymnasium's CartPole-v1 with a numbagrad (or PyTorch) Q-network.

    python scripts/train_rl.py --seed 0                # numbagrad, the update compiled
    python scripts/train_rl.py --seed 0 --peer torch   # the same agent, PyTorch's Q-network
    python scripts/train_rl.py --seed 0 --peer both    # both, one after the other, timed

The agent: a Q-network 4-64-64-2 (ReLU; the ``dqn`` bench case's,
``bench_peers.dqn_model``), a replay buffer of ``--buffer`` transitions, a
target network copied from the Q-network with ``load_state_dict`` every
``--target-every`` steps, epsilon-greedy exploration with epsilon falling
linearly from 1 to ``--eps-final`` over ``--eps-steps`` steps, and after
``--warmup`` random steps one update per environment step on a batch of
``--batch-size``: smooth L1 between Q(s, a) (``ng.gather``) and
r + gamma * max_a' Q_target(s', a') (``ng.max``; no bootstrap where the pole
fell, but where the 500-step limit truncated the episode), Adam with the
gradient's norm clipped to ``--clip``. With ``--compile`` (the default) the
update runs through ``ng.compile``. ``--peer torch`` runs the same agent with
a PyTorch Q-network started from the same weights (loaded from numbagrad's
state dict), the same seeds, environment and replay sampling; its float
rounding differs, so its episodes part ways with numbagrad's after a while.

Evaluation is greedy (no exploration) on environments of their own: every
``--eval-every`` steps ``--eval-episodes`` (10) episodes, and when their mean
return is at least 475, 100 more episodes. The run is *solved* when those
100 consecutive episodes average at least 475; it stops there unless
``--no-stop``. The script prints each evaluation, the step at which it was
solved (or that it was not within ``--total-steps``) and the wall time of the
whole run (environment steps, updates and evaluations).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import numbagrad as ng  # noqa: E402
from bench_peers import DQN_NAMES, dqn_model, ng_td_loss, torch_td_loss  # noqa: E402
from train_mlp import progress_bar  # noqa: E402

CASE = "dqn"          # the bench case whose Q-network this trains
ENV = "CartPole-v1"
GOAL, FINAL_EPISODES = 475.0, 100


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--total-steps", type=int, default=100_000, help="environment steps at most")
    p.add_argument("--seed", type=int, default=0, help="weights, environment and sampling")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="numbagrad: the update step through ng.compile (default: on)")
    p.add_argument("--peer", choices=["numbagrad", "torch", "both"], default="numbagrad",
                   help="whose Q-network; both: numbagrad's run, then PyTorch's")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--buffer", type=int, default=50_000, help="replay buffer capacity")
    p.add_argument("--warmup", type=int, default=1000, help="random steps before updates")
    p.add_argument("--target-every", type=int, default=500,
                   help="steps between copies of the Q-network into the target network")
    p.add_argument("--eps-final", type=float, default=0.05)
    p.add_argument("--eps-steps", type=int, default=10_000,
                   help="steps over which epsilon falls from 1 to --eps-final")
    p.add_argument("--clip", type=float, default=10.0, help="max gradient norm (0: none)")
    p.add_argument("--eval-every", type=int, default=2000, help="steps between evaluations")
    p.add_argument("--eval-episodes", type=int, default=10,
                   help="episodes of the quick evaluation (100 more when it reaches 475)")
    p.add_argument("--stop", action=argparse.BooleanOptionalAction, default=True,
                   help="stop once solved (default) or run all --total-steps")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    for name in ("total_steps", "batch_size", "buffer", "target_every", "eval_every",
                 "eval_episodes"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < args.batch_size:
        p.error(f"--warmup ({args.warmup}) must be at least --batch-size ({args.batch_size})")
    if not 0 <= args.eps_final <= 1 or not 0 <= args.gamma <= 1:
        p.error("--eps-final and --gamma must be in [0, 1]")
    return args


# ------------------------------------------------------------------ the Q-networks
class NumbagradQ:
    """The Q-network, its target and the update step in numbagrad."""

    name = "numbagrad"

    def __init__(self, state: dict, args: argparse.Namespace) -> None:
        self.qnet, self.target = (dqn_model(ng.nn, CASE, dtype=np.float32) for _ in range(2))
        self.qnet.load_state_dict(state)
        for p in self.target.parameters():
            p.requires_grad = False      # the TD target: no gradient, read as it is now
        self.sync()
        self.opt = ng.optim.Adam(self.qnet.parameters(), lr=args.lr,
                                 max_grad_norm=args.clip or None)
        loss_fn = ng_td_loss(ng, self.qnet, self.target)
        if args.compile:
            self.update = ng.compile(loss_fn, optimizer=self.opt)
        else:
            def update(*batch):
                with ng.grad_tape():
                    loss = loss_fn(*batch)
                loss.backward()
                self.opt.step()
                return loss
            self.update = update

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self.qnet(ng.as_tensor(obs)).numpy()

    def sync(self) -> None:
        self.target.load_state_dict(self.qnet.state_dict())

    def state_dict(self) -> dict:
        return self.qnet.state_dict()


class TorchQ:
    """The same with PyTorch's modules, Adam and gradient clipping (one thread)."""

    name = "torch"

    def __init__(self, state: dict, args: argparse.Namespace) -> None:
        import torch
        torch.set_num_threads(1)    # tiny tensors: more threads only add overhead here
        self.torch = torch
        self.qnet, self.target = (dqn_model(torch.nn, CASE) for _ in range(2))
        self.qnet.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        self.target.requires_grad_(False)
        self.sync()
        self.opt = torch.optim.Adam(self.qnet.parameters(), lr=args.lr)
        self.loss_fn = torch_td_loss(torch, self.qnet, self.target)
        self.clip = args.clip

    def update(self, s, a, r, s2, discount):
        torch = self.torch
        loss = self.loss_fn(*(torch.from_numpy(b) for b in (s, a, r, s2, discount)))
        self.opt.zero_grad()
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.qnet.parameters(), self.clip)
        self.opt.step()
        return loss

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        with self.torch.no_grad():
            return self.qnet(self.torch.from_numpy(obs)).numpy()

    def sync(self) -> None:
        self.target.load_state_dict(self.qnet.state_dict())

    def state_dict(self) -> dict:
        return {k: v.detach().numpy().copy() for k, v in self.qnet.state_dict().items()}


def initial_state(seed: int) -> dict:
    """The Q-network's starting weights (PyTorch's default init, drawn from ``seed``)."""
    net = dqn_model(ng.nn, CASE, dtype=np.float32, rng=np.random.default_rng(seed))
    state = net.state_dict()
    assert tuple(state) == DQN_NAMES
    return state


# ------------------------------------------------------------------ replay
class Replay:
    """A ring buffer of transitions and a preallocated sampled batch."""

    def __init__(self, capacity: int, batch: int, obs_dim: int) -> None:
        self.s = np.zeros((capacity, obs_dim), np.float32)
        self.s2 = np.zeros_like(self.s)
        self.a = np.zeros((capacity, 1), np.int64)
        self.r = np.zeros((capacity, 1), np.float32)
        self.discount = np.zeros((capacity, 1), np.float32)
        self.size = self.at = 0
        self.batch = tuple(np.zeros((batch,) + x.shape[1:], x.dtype)
                           for x in (self.s, self.a, self.r, self.s2, self.discount))

    def add(self, s, a, r, s2, discount) -> None:
        i = self.at
        self.s[i], self.a[i, 0], self.r[i, 0], self.s2[i], self.discount[i, 0] = \
            s, a, r, s2, discount
        self.at = (i + 1) % len(self.s)
        self.size = min(self.size + 1, len(self.s))

    def sample(self, rng: np.random.Generator) -> tuple:
        """(s, a, r, s2, discount) of uniformly drawn transitions, always in the same arrays."""
        idx = rng.integers(0, self.size, len(self.batch[0]))
        for src, out in zip((self.s, self.a, self.r, self.s2, self.discount), self.batch):
            np.take(src, idx, axis=0, out=out)
        return self.batch


# ------------------------------------------------------------------ the run
def evaluate(agent, seeds: list[int]) -> np.ndarray:
    """Greedy returns of one episode per seed, the environments stepped side by side."""
    import gymnasium as gym
    envs = [gym.make(ENV) for _ in seeds]
    obs = np.stack([env.reset(seed=s)[0] for env, s in zip(envs, seeds)]).astype(np.float32)
    returns = np.zeros(len(seeds))
    live = np.ones(len(seeds), bool)
    while live.any():
        actions = agent.q_values(obs[live]).argmax(axis=1)
        for i, a in zip(np.flatnonzero(live), actions):
            o, r, terminated, truncated, _ = envs[i].step(int(a))
            obs[i] = o
            returns[i] += r
            live[i] = not (terminated or truncated)
    for env in envs:
        env.close()
    return returns


def run(agent_cls, args: argparse.Namespace, out=print) -> dict:
    """One DQN run; returns its evaluations, the step solved at (or None) and its time."""
    import gymnasium as gym
    start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    env = gym.make(ENV)
    env.action_space.seed(args.seed)
    agent = agent_cls(initial_state(args.seed), args)
    replay = Replay(args.buffer, args.batch_size, env.observation_space.shape[0])
    eval_seeds = [10_000 * (args.seed + 1) + i for i in range(args.eval_episodes)]
    final_seeds = [10_000 * (args.seed + 1) + 5_000 + i for i in range(FINAL_EPISODES)]
    obs, _ = env.reset(seed=args.seed)
    episode_return, episodes, updates, solved = 0.0, [], 0, None
    evaluations = []
    bar = progress(args, agent.name)
    out = bar.write if bar is not None else out
    try:
        for step in range(1, args.total_steps + 1):
            eps = max(args.eps_final, 1.0 - (1.0 - args.eps_final) * step / args.eps_steps)
            if step <= args.warmup or rng.random() < eps:
                action = int(rng.integers(env.action_space.n))
            else:
                action = int(agent.q_values(obs[None].astype(np.float32))[0].argmax())
            obs2, reward, terminated, truncated, _ = env.step(action)
            replay.add(obs, action, reward, obs2, 0.0 if terminated else args.gamma)
            episode_return += reward
            obs = obs2
            if terminated or truncated:
                episodes.append(episode_return)
                episode_return = 0.0
                obs, _ = env.reset()
            if step > args.warmup:
                agent.update(*replay.sample(rng))
                updates += 1
            if step % args.target_every == 0:
                agent.sync()
            if bar is not None and step % 100 == 0:
                bar.update(100)
                bar.set_postfix(episodes=len(episodes),
                                last10=f"{np.mean(episodes[-10:]) if episodes else 0:.0f}")
            if step % args.eval_every == 0 and step > args.warmup:
                quick = evaluate(agent, eval_seeds).mean()
                full = evaluate(agent, final_seeds).mean() if quick >= GOAL else None
                evaluations.append({"step": step, "quick": float(quick),
                                    "full": None if full is None else float(full)})
                out(f"step {step:6d}  episodes {len(episodes):4d}  eps {eps:.3f}  "
                    f"greedy return: {args.eval_episodes} episodes {quick:6.1f}"
                    + ("" if full is None else f", {FINAL_EPISODES} episodes {full:6.1f}"))
                if full is not None and full >= GOAL and solved is None:
                    solved = step
                    if args.stop:
                        break
    finally:
        if bar is not None:
            bar.close()
        env.close()
    seconds = time.perf_counter() - start
    return {"peer": agent.name, "steps": step, "updates": updates, "solved_at": solved,
            "evaluations": evaluations, "episodes": len(episodes), "seconds": seconds,
            "weights": agent.state_dict()}


def progress(args: argparse.Namespace, name: str) -> object | None:
    return progress_bar(args, total=args.total_steps, unit="step", desc=f"train_rl {name}")


def report(result: dict, args: argparse.Namespace) -> str:
    what = (f"solved at step {result['solved_at']} (mean greedy return >= {GOAL:.0f} over "
            f"{FINAL_EPISODES} episodes)" if result["solved_at"] is not None
            else f"not solved within {result['steps']} steps")
    mode = ("compiled" if args.compile else "eager") if result["peer"] == "numbagrad" else "eager"
    return (f"{result['peer']} ({mode}): {what}; {result['steps']} steps, {result['updates']} "
            f"updates, {result['episodes']} episodes in {result['seconds']:.1f}s "
            f"({1e6 * result['seconds'] / result['steps']:.0f} us a step)")


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    peers = {"numbagrad": [NumbagradQ], "torch": [TorchQ], "both": [NumbagradQ, TorchQ]}
    print(f"{ENV}: DQN, Q-network 4-64-64-2, seed {args.seed}, at most {args.total_steps} steps; "
          f"lr {args.lr}, batch {args.batch_size}, buffer {args.buffer}, target every "
          f"{args.target_every}, epsilon 1 -> {args.eps_final} over {args.eps_steps}")
    results = {}
    for cls in peers[args.peer]:
        result = run(cls, args)
        results[result["peer"]] = result
        print(report(result, args))
    if len(results) == 2:
        ng_s, torch_s = results["numbagrad"]["seconds"], results["torch"]["seconds"]
        per_step = ((ng_s / results["numbagrad"]["steps"])
                    / (torch_s / results["torch"]["steps"]))
        print(f"wall time: numbagrad {ng_s:.1f}s, PyTorch {torch_s:.1f}s "
              f"({ng_s / torch_s:.2f}x the run, {per_step:.2f}x a step)")
    return results


if __name__ == "__main__":
    main()
