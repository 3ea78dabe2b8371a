"""scripts/train_rl.py: DQN on CartPole runs end to end; its update step is the
same compiled and eager, and its loss's gradients (gather, max, smooth L1) are
PyTorch's."""
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gymnasium", reason="the rl extra (gymnasium) is not installed")

import numbagrad as ng
from numbagrad.compile import CompiledStep

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
import bench_peers
import train_rl

TINY = ["--total-steps", "300", "--warmup", "100", "--eval-every", "150",
        "--eval-episodes", "2", "--target-every", "50", "--no-progress"]


def test_runs_both_peers_and_reports_their_times(capsys):
    pytest.importorskip("torch")
    results = train_rl.main(TINY + ["--peer", "both", "--seed", "3"])
    out = capsys.readouterr().out
    assert set(results) == {"numbagrad", "torch"}
    for name, result in results.items():
        assert (result["steps"], result["updates"]) == (300, 200), name
        assert [e["step"] for e in result["evaluations"]] == [150, 300], name
        assert result["solved_at"] is None and result["episodes"] > 0
        assert f"{name} (" in out and "not solved within 300 steps" in out
    assert "wall time: numbagrad" in out and "PyTorch" in out
    # the same start: both Q-networks left the seed's initial weights, by about as much
    start = train_rl.initial_state(3)
    for key, w in start.items():
        moved = [np.abs(r["weights"][key] - w).max() for r in results.values()]
        assert min(moved) > 0 and max(moved) < 1, key


def test_eager_run_and_progress_bar(capsys):
    pytest.importorskip("tqdm")
    args = [a for a in TINY if a != "--no-progress"]
    result = train_rl.main(args + ["--no-compile"])["numbagrad"]
    captured = capsys.readouterr()
    assert result["updates"] == 200 and "numbagrad (eager)" in captured.out
    assert "step" in captured.err and "300/300" in captured.err


def _replay(seed=0, n=500):
    rng = np.random.default_rng(seed)
    replay = train_rl.Replay(n, 64, 4)
    for i in range(n):
        replay.add(rng.normal(size=4), int(rng.integers(2)), 1.0, rng.normal(size=4),
                   0.0 if i % 7 == 0 else 0.99)
    return replay


def test_update_step_compiled_is_eager_bit_for_bit():
    args = train_rl.parse([])
    state = train_rl.initial_state(1)
    agents = []
    for compiled in (False, True):
        args.compile = compiled
        agent = train_rl.NumbagradQ(state, args)
        rng, replay, losses = np.random.default_rng(0), _replay(), []
        for i in range(12):
            losses.append(agent.update(*replay.sample(rng)).item())
            if i % 5 == 4:
                agent.sync()
        agents.append((agent, losses))
    (eager, eager_losses), (compiled, compiled_losses) = agents
    assert compiled_losses == eager_losses
    assert isinstance(compiled.update, CompiledStep)
    for key, w in eager.state_dict().items():
        np.testing.assert_array_equal(compiled.state_dict()[key], w, err_msg=key)
        assert not np.array_equal(w, state[key]), key
    for a, b in zip(compiled.target.parameters(), eager.target.parameters()):
        assert a.grad is None and b.grad is None                 # the target is never trained
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_td_loss_gradients_match_torch_float64():
    torch = pytest.importorskip("torch")
    qparams, tparams, batch = bench_peers.dqn_problem("dqn", np.float64)
    s, a, r, s2, discount = batch
    a[:3] = 1      # repeated actions and a tie in the target's max: its gradient is none anyway
    s2[0] = 0.0
    qnet, target = (bench_peers.dqn_model(ng.nn, "dqn", dtype=np.float64) for _ in range(2))
    qnet.load_state_dict(dict(zip(bench_peers.DQN_NAMES, qparams)))
    target.load_state_dict(dict(zip(bench_peers.DQN_NAMES, tparams)))
    for p in target.parameters():
        p.requires_grad = False
    with ng.grad_tape():
        loss = bench_peers.ng_td_loss(ng, qnet, target)(*batch)
    grads = ng.backward(loss)

    tq, tt = (bench_peers.dqn_model(torch.nn, "dqn", dtype=torch.float64) for _ in range(2))
    tq.load_state_dict({n: torch.from_numpy(p) for n, p in zip(bench_peers.DQN_NAMES, qparams)})
    tt.load_state_dict({n: torch.from_numpy(p) for n, p in zip(bench_peers.DQN_NAMES, tparams)})
    want = bench_peers.torch_td_loss(torch, tq, tt)(*(torch.from_numpy(b) for b in batch))
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    for (name, p), tp in zip(qnet.named_parameters(), tq.parameters()):
        np.testing.assert_allclose(np.asarray(grads[p.id]), tp.grad.numpy(), rtol=1e-9,
                                   atol=1e-12, err_msg=name)
    assert all(p.id not in grads for p in target.parameters())
    assert all(tp.grad is None for tp in tt.parameters())


def test_bad_flags_are_refused():
    with pytest.raises(SystemExit):
        train_rl.parse(["--warmup", "10"])            # fewer than a batch
    with pytest.raises(SystemExit):
        train_rl.parse(["--eps-final", "2"])
