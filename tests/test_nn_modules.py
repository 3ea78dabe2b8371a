"""ng.nn's module features (train/eval, the module tree, buffers in state dicts)
and generic layers (Embedding, Dropout, Flatten, Identity, ModuleList,
ModuleDict) against PyTorch's."""
import warnings

import numpy as np
import pytest
import torch

import numbagrad as ng
from conftest import cuda_dev, cuda_launches

nn = ng.nn
TOL = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-9, atol=1e-12)}
TDT = {np.float32: torch.float32, np.float64: torch.float64}


def host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def torch_state(module):
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


# ------------------------------------------------------------ embedding
@pytest.mark.parametrize("dt", [np.float32, np.float64], ids=["f32", "f64"])
def test_embedding_matches_torch_values_and_gradient_with_padding(dev, dt):
    torch.manual_seed(0)
    ref = torch.nn.Embedding(6, 3, padding_idx=2, dtype=TDT[dt])
    layer = nn.Embedding(6, 3, padding_idx=2, dtype=dt, device=dev.name,
                         rng=np.random.default_rng(0))
    assert list(layer.state_dict()) == ["weight"] and layer.weight.shape == (6, 3)
    np.testing.assert_array_equal(layer.weight.numpy()[2], 0)   # the padding row starts at 0
    layer.load_state_dict(torch_state(ref))
    idx = np.array([[0, 2, 5], [2, 2, 1]])             # repeats, and the padding index
    g = np.random.default_rng(1).normal(size=(2, 3, 3)).astype(dt)
    with ng.grad_tape():
        out = layer(idx)
        loss = (out * dev.tensor(g)).sum()
    grads = ng.backward(loss)
    want = ref(torch.tensor(idx))
    (want * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), **TOL[dt])
    got = host(grads[layer.weight.id])
    np.testing.assert_allclose(got, ref.weight.grad.numpy(), **TOL[dt])
    np.testing.assert_array_equal(got[2], 0)


def test_embedding_functional_matches_torch_and_gradchecks():
    w = np.random.default_rng(3).normal(size=(5, 4))
    idx = np.array([4, 0, 4, -1 + 5])
    for pad in (None, 0, -1):
        torch_pad = None if pad is None else pad % 5
        ps, ts = ng.param(w), torch.tensor(w, requires_grad=True)
        with ng.grad_tape():
            loss = (ng.embedding(idx, ps, padding_idx=pad) ** 2).sum()
        grads = ng.backward(loss)
        (torch.nn.functional.embedding(torch.tensor(idx), ts, padding_idx=torch_pad) ** 2
         ).sum().backward()
        np.testing.assert_allclose(loss.item(), float((ts.detach() ** 2)[idx].sum()),
                                   rtol=1e-12)
        np.testing.assert_allclose(grads[ps.id], ts.grad.numpy(), rtol=1e-12)
    W = ng.param(w)      # (no padding: its row's gradient is 0 by design, not by calculus)
    ng.gradcheck(lambda: (ng.embedding(np.array([[1, 3], [3, 0]]), W) ** 2).sum(), [W])


def test_embedding_bad_input_raises_naming_the_problem():
    W = ng.param(np.zeros((4, 2)))
    with pytest.raises(IndexError, match="embedding: index 4 is out of range for axis 0 of "
                                         "size 4"):
        ng.embedding(np.array([1, 4]), W)
    with pytest.raises(IndexError, match="index -1 is out of range"):
        ng.embedding(np.array([-1]), W)                    # PyTorch refuses negatives too
    with pytest.raises(TypeError, match="indices must be integers"):
        ng.embedding(np.array([0.5]), W)
    with pytest.raises(ValueError, match="weight must be 2-D"):
        ng.embedding(np.array([0]), ng.param(np.zeros(4)))
    with pytest.raises(ValueError, match=r"padding_idx 4 is out of range for 4 embeddings"):
        ng.embedding(np.array([0]), W, padding_idx=4)
    with pytest.raises(ValueError, match="padding_idx must be an int"):
        nn.Embedding(4, 2, padding_idx=-5)
    with pytest.raises(ValueError, match="embedding_dim must be a positive integer"):
        nn.Embedding(4, 0)
    np.testing.assert_array_equal(W.numpy(), 0)
    assert W.grad is None


def test_embedding_cuda_one_launch_each_way():
    dev = cuda_dev()
    W = dev.param(np.arange(12.0).reshape(6, 2))
    assert cuda_launches(lambda w: ng.embedding(np.array([1, 5, 1]), w, padding_idx=5), W) \
        == (1, 1)


def test_embedding_compiled_is_bit_identical_to_eager(tmp_path):
    def make():
        emb = nn.Embedding(7, 3, dtype=np.float32, rng=np.random.default_rng(0))
        return emb, ng.optim.SGD(emb.parameters(), lr=0.1, accumulate_steps=2)

    rng = np.random.default_rng(2)
    data = [(rng.integers(0, 7, size=(2, 4)), rng.normal(size=(2, 4, 3)).astype(np.float32))
            for _ in range(5)]
    emb, opt = make()
    want = []
    for idx, y in data:
        with ng.grad_tape():
            loss = ng.mse_loss(emb(idx), y)
        loss.backward()
        opt.step()
        want.append(loss.item())
    twin, topt = make()
    step = ng.compile(lambda i, y: ng.mse_loss(twin(i), y), optimizer=topt,
                      cache_dir=str(tmp_path))
    assert [step(idx, y).item() for idx, y in data] == want
    assert step.stats[0]["mode"] == "njit"
    np.testing.assert_array_equal(twin.weight.numpy(), emb.weight.numpy())


# ------------------------------------------------------------ small layers
def test_flatten_identity_and_dropout_layers_match_torch(dev):
    x = np.random.default_rng(4).normal(size=(2, 3, 4))
    for ours, ref in [(nn.Flatten(), torch.nn.Flatten()),
                      (nn.Flatten(0, 1), torch.nn.Flatten(0, 1)),
                      (nn.Identity(3, key=1), torch.nn.Identity(3, key=1))]:
        t = torch.tensor(x, requires_grad=True)
        want = ref(t)
        p = dev.param(x)
        with ng.grad_tape():
            out = ours(p)
            loss = (out * dev.tensor(np.ones(tuple(want.shape)) * 2)).sum()
        grads = ng.backward(loss)
        (want * 2).sum().backward()
        np.testing.assert_array_equal(out.numpy(), want.detach().numpy())
        np.testing.assert_array_equal(host(grads[p.id]), t.grad.numpy())
    drop, tdrop = nn.Dropout(0.25), torch.nn.Dropout(0.25)
    assert repr(drop) == "Dropout(p=0.25)" and drop.training
    out = drop(dev.tensor(x)).numpy()
    np.testing.assert_allclose(out[out != 0], x[out != 0] / 0.75, rtol=1e-12)
    tdrop.eval()
    np.testing.assert_array_equal(drop.eval()(dev.tensor(x)).numpy(),
                                  tdrop(torch.tensor(x)).numpy())


# ------------------------------------------------------------ containers
def test_module_list_indexes_renumbers_and_names_like_torch():
    torch.manual_seed(0)
    ref = torch.nn.ModuleList([torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1)]
                              ).double()
    ours = nn.ModuleList([nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)])
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(torch_state(ref))
    assert len(ours) == 3 and isinstance(ours[-1], nn.Linear) and len(ours[1:]) == 2
    del ours[1], ref[1]
    ours.insert(0, nn.Tanh())
    ref.insert(0, torch.nn.Tanh())
    ours.append(nn.Identity())
    ref.append(torch.nn.Identity())
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in ours.named_children()] == [n for n, _ in ref.named_children()]
    np.testing.assert_array_equal(ours[1].weight.numpy(), ref[1].weight.detach().numpy())
    ours[0] = nn.Sigmoid()
    assert type(ours[0]) is nn.Sigmoid
    with pytest.raises(IndexError, match="index 4 is out of range for 4 modules"):
        ours[4]
    with pytest.raises(TypeError, match="item 1: int is not an ng.nn.Module"):
        ours.extend([nn.ReLU(), 3])
    assert len(ours) == 4
    with pytest.raises(NotImplementedError):
        ours(1)


def test_module_dict_is_a_mapping_with_torchs_names():
    torch.manual_seed(0)
    ref = torch.nn.ModuleDict({"enc": torch.nn.Linear(2, 2), "head": torch.nn.Linear(2, 1)})
    ours = nn.ModuleDict({"enc": nn.Linear(2, 2), "head": nn.Linear(2, 1)})
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(torch_state(ref.double()))
    with pytest.raises(KeyError, match="attribute 'train' already exists"):
        ref["train"] = torch.nn.ReLU()
    with pytest.raises(KeyError, match="attribute 'train' already exists"):
        ours["train"] = nn.ReLU()                                        # as PyTorch
    assert ours.enc is ours["enc"] and "enc" in ours and list(ours) == ["enc", "head"]
    ours.update([("dec", nn.Linear(1, 2))])
    assert ours.keys() == ["enc", "head", "dec"] and len(ours) == 3
    assert isinstance(ours.pop("dec"), nn.Linear) and len(ours) == 2
    for key in ("a.b", "", 3):
        with pytest.raises(KeyError, match="a key is a non-empty string without '.'"):
            ours.update({key: nn.ReLU()})
    with pytest.raises(KeyError, match="ModuleDict has no key 'nope'"):
        ours["nope"]
    assert len(ours) == 2


# ------------------------------------------------------------ Module features
class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4, padding_idx=0)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)])
        self.register_buffer("shift", torch.randn(3))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)
        self.heads = torch.nn.ModuleDict({"out": torch.nn.Linear(3, 2)})
        self.drop = torch.nn.Dropout(0.3)
        self.flat = torch.nn.Flatten()

    def forward(self, idx):
        h = self.emb(idx)
        for block in self.blocks:
            h = torch.tanh(block(h))
        return self.flat(self.heads["out"](self.drop(h + self.shift)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, padding_idx=0)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 3)])
        self.register_buffer("shift", np.zeros(3))
        self.register_buffer("scratch", np.zeros(2), persistent=False)
        self.heads = nn.ModuleDict({"out": nn.Linear(3, 2)})
        self.drop = nn.Dropout(0.3)
        self.flat = nn.Flatten()

    def forward(self, idx):
        h = self.emb(idx)
        for block in self.blocks:
            h = ng.tanh(block(h))
        return self.flat(self.heads["out"](self.drop(h + self.shift)))


def test_a_torch_state_dict_with_a_buffer_loads_and_gives_the_same_outputs(dev):
    torch.manual_seed(0)
    ref = TorchNet().double()
    net = Net()
    assert list(net.state_dict()) == list(ref.state_dict())       # buffers under torch's keys
    assert [n for n, _ in net.named_buffers()] == [n for n, _ in ref.named_buffers()]
    net.load_state_dict(torch_state(ref))
    np.testing.assert_array_equal(net.shift.numpy(), ref.shift.numpy())
    net.to(dev.name)
    assert net.shift.device == dev.name and net.emb.weight.device == dev.name
    net.eval()
    ref.eval()
    idx = np.array([[1, 0, 3], [9, 9, 2]])
    with ng.grad_tape():
        out = net(idx)
        loss = (out * out).sum()
    grads = ng.backward(loss)
    want = ref(torch.tensor(idx))
    (want * want).sum().backward()
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    for (name, p), (tname, tp) in zip(net.named_parameters(), ref.named_parameters()):
        assert name == tname
        np.testing.assert_allclose(host(grads[p.id]), tp.grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=name)
    assert net.shift.id not in grads                               # a buffer gets no gradient
    saved = net.state_dict()
    assert set(saved) == set(ref.state_dict()) and "scratch" not in saved


def test_the_module_tree_iterators_train_eval_and_apply_follow_torch():
    torch.manual_seed(0)
    ref, net = TorchNet(), Net()
    shared = nn.Linear(2, 2)
    net.blocks.append(shared)
    net.blocks.append(shared)                              # one module twice
    ref.blocks.append(ref.blocks[0])
    ref.blocks[2] = torch.nn.Linear(2, 2)
    ref.blocks.append(ref.blocks[2])
    for name in ("modules", "children"):
        assert not isinstance(getattr(net, name)(), list)
        assert iter(getattr(net, name)()) is not None
    assert [n for n, _ in net.named_modules()] == [n for n, _ in ref.named_modules()]
    assert [n for n, _ in net.named_children()] == [n for n, _ in ref.named_children()]
    assert [type(m).__name__ for m in net.children()] == \
        [type(m).__name__ for m in ref.children()]
    assert len(list(net.modules())) == len(list(ref.modules()))
    assert net.eval() is net and not any(m.training for m in net.modules())
    net.blocks.train()
    assert net.blocks[0].training and not net.training and not net.drop.training
    with pytest.raises(ValueError, match="mode must be a bool"):
        net.train("yes")
    seen = []
    assert net.apply(lambda m: seen.append(type(m).__name__)) is net
    tseen = []
    ref.apply(lambda m: tseen.append(type(m).__name__.replace("TorchNet", "Net")))
    assert seen == tseen and seen[-1] == "Net"


def test_zero_grad_register_buffer_checks_and_init_through_apply():
    net = Net()
    with ng.grad_tape():
        loss = net(np.array([[1, 2]])).sum()
    loss.backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    with pytest.raises(KeyError, match="attribute 'emb' already exists"):
        net.register_buffer("emb", np.zeros(1))
    with pytest.raises(KeyError, match="without '.'"):
        net.register_buffer("a.b", np.zeros(1))
    with pytest.raises(TypeError, match="a param cannot be a buffer"):
        net.register_buffer("w", ng.param(np.zeros(1)))
    net.register_buffer("count", np.array(0, np.int64))
    assert net.state_dict()["count"].dtype == np.int64            # integers stay integers
    net.count = np.array(7, np.int64)                              # re-assigning a buffer
    assert net.state_dict()["count"] == 7 and dict(net.named_buffers())["count"] is net.count
    with pytest.raises(TypeError, match="'count' has dtype float64, the buffer has int64"):
        net.load_state_dict({**net.state_dict(), "count": np.array(1.0)})
    assert net.state_dict()["count"] == 7
    rng = np.random.default_rng(0)

    def init(m):
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)
            nn.init.xavier_uniform_(m.weight, generator=rng)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net.apply(init)
    assert all(not m.bias.numpy().any() for m in net.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize("make", [lambda nn: nn.GELU(), lambda nn: nn.GELU("tanh"),
                                  lambda nn: nn.SiLU(), lambda nn: nn.Softplus(),
                                  lambda nn: nn.Softplus(2.0, 5.0)])
def test_activation_layers_match_torch(dev, make):
    x = np.linspace(-6, 6, 25).reshape(5, 5)
    X = dev.param(x)
    with ng.grad_tape():
        loss = ng.sum(make(ng.nn)(X) * X)
    loss.backward()
    T = torch.tensor(x, requires_grad=True)
    (make(torch.nn)(T) * T).sum().backward()
    np.testing.assert_allclose(dev.host(X.grad), T.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_activation_layers_refuse_bad_arguments():
    with pytest.raises(ValueError, match="approximate"):
        ng.nn.GELU("fast")


LOSS_CASES = [
    ("MSELoss", {"reduction": "sum"}, "float"), ("L1Loss", {}, "float"),
    ("SmoothL1Loss", {"beta": 0.5}, "float"), ("HuberLoss", {"delta": 0.7, "reduction": "none"},
                                               "float"),
    ("BCELoss", {}, "prob"), ("BCEWithLogitsLoss", {"reduction": "sum"}, "prob"),
    ("CrossEntropyLoss", {"label_smoothing": 0.1, "ignore_index": 1}, "class"),
    ("NLLLoss", {"reduction": "sum"}, "class"),
]


@pytest.mark.parametrize("name, options, kind", LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_loss_modules_match_torch(name, options, kind):
    import torch
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 3))
    if kind == "prob":
        x = 1 / (1 + np.exp(-x)) if name == "BCELoss" else x
        target = rng.uniform(size=(4, 3))
    elif kind == "class":
        x = x - np.log(np.exp(x).sum(1, keepdims=True)) if name == "NLLLoss" else x
        target = np.array([0, 2, 1, 2])
    else:
        target = rng.normal(size=(4, 3))
    p = ng.param(x)
    with ng.grad_tape():
        loss = getattr(ng.nn, name)(**options)(p, target)
        total = ng.sum(loss)
    total.backward()
    t = torch.tensor(x, requires_grad=True)
    want = getattr(torch.nn, name)(**options)(t, torch.tensor(target))
    want.sum().backward()
    np.testing.assert_allclose(loss.numpy(), want.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_loss_modules_check_their_options_when_built():
    with pytest.raises(ValueError, match="MSELoss: reduction must be one of"):
        ng.nn.MSELoss(reduction="avg")
    with pytest.raises(ValueError, match="CrossEntropyLoss: weight= .* is not supported"):
        ng.nn.CrossEntropyLoss(weight=np.ones(3))
    with pytest.raises(ValueError, match="CrossEntropyLoss: label_smoothing"):
        ng.nn.CrossEntropyLoss(label_smoothing=2.0)
    with pytest.raises(ValueError, match="HuberLoss: delta"):
        ng.nn.HuberLoss(delta=0)
