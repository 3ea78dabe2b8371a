"""The product's promise with the issue-17 layers: k accumulated micro-batches
land where the full batch lands (to 1e-8) for a model with LayerNorm,
GroupNorm, causal multi-head attention and dropout(p=0), on both devices."""
import numpy as np

import numbagrad as ng

B, T, E, HEADS = 4, 3, 4, 2


def _model(device):
    rng = np.random.default_rng(5)
    kw = dict(device=device)
    ln = ng.nn.LayerNorm(E, **kw)
    attn = ng.nn.MultiheadAttention(E, HEADS, rng=rng, **kw)
    gn = ng.nn.GroupNorm(2, E, **kw)
    head = ng.nn.Linear(E, 2, rng=rng, **kw)
    for m in (ln, gn):   # affine params away from their 1 and 0 inits
        m.weight = ng.param(rng.normal(size=E) + 1, device=device)
        m.bias = ng.param(rng.normal(size=E), device=device)
    params = ln.parameters() + attn.parameters() + gn.parameters() + head.parameters()

    def loss_fn(x, y):
        h = ln(x)
        h = x + attn(h, h, h, is_causal=True)[0]            # (b, T, E)
        h = ng.transpose(gn(ng.transpose(h, 1, 2)), 1, 2)   # GroupNorm over the E channels
        h = ng.dropout(h, p=0.0)
        return ng.mse_loss(head(h), y)
    return params, loss_fn


def test_k_micro_batches_equal_the_full_batch_with_attention_and_norms(dev):
    k = B
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(B, T, E)), rng.normal(size=(B, T, 2))
    (pa, fa), (pb, fb) = _model(dev.name), _model(dev.name)
    start = [p.numpy() for p in pa]
    oa = ng.optim.SGD(pa, lr=0.5, momentum=0.9, accumulate_steps=k)
    ob = ng.optim.SGD(pb, lr=0.5, momentum=0.9)
    for _ in range(2):                     # two windows
        for i in range(k):
            with ng.grad_tape():
                loss = fa(dev.tensor(x[i:i + 1]), dev.tensor(y[i:i + 1]))
            loss.backward()
            oa.step()
        with ng.grad_tape():
            loss = fb(dev.tensor(x), dev.tensor(y))
        loss.backward()
        ob.step()
    assert oa.t == ob.t == 2
    for a, b, s in zip(pa, pb, start):
        assert not np.allclose(a.numpy(), s)          # every param moved
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-8)
