"""numbagrad.sklearn's structure: the one parameter list both estimators
share, and the one L2-penalty path both devices run."""
import inspect

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn import neural_network as sk

from numbagrad.sklearn import MLPClassifier, MLPRegressor
from numbagrad.sklearn._base import _add_l2
from numbagrad.sklearn._params import PARAMS


@pytest.mark.parametrize("ours, theirs, leading", [(MLPClassifier, sk.MLPClassifier, []),
                                                   (MLPRegressor, sk.MLPRegressor, ["loss"])])
def test_both_estimators_take_the_shared_parameters_as_scikit_learn_does(ours, theirs, leading):
    names = leading + [name for name, _ in PARAMS]
    params = inspect.signature(ours).parameters
    assert list(params) == names
    assert sorted(ours().get_params()) == sorted(names)
    defaults = dict(PARAMS)
    assert all(params[n].default == defaults[n] for n in defaults)
    # scikit-learn's own: the same defaults, and the same ones passed by position
    sk_params = inspect.signature(theirs).parameters
    shared = [n for n in names if n in sk_params]
    assert len(shared) >= len(names) - 3       # all but accumulate_steps, dtype, device
    assert all(params[n].default == sk_params[n].default for n in shared)
    positional = [n for n, p in params.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == [n for n, p in sk_params.items() if p.kind == p.POSITIONAL_OR_KEYWORD]


def test_arguments_are_stored_as_given_and_bad_ones_name_the_estimator():
    reg = MLPRegressor("poisson", (4,), "tanh", alpha=0.5, device="cuda")
    assert (reg.loss, reg.hidden_layer_sizes, reg.activation) == ("poisson", (4,), "tanh")
    assert reg.get_params()["alpha"] == 0.5 and reg.device == "cuda"   # checked at fit
    clf = MLPClassifier(random_state=3)
    assert clf.random_state == 3 and clf.max_iter == 200 and not hasattr(clf, "loss")
    with pytest.raises(TypeError, match=r"MLPClassifier\(\): too many positional"):
        MLPClassifier((3,), "relu", "adam")
    with pytest.raises(TypeError, match=r"MLPRegressor\(\): .*'lr'"):
        MLPRegressor(lr=0.1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_l2_penalty_adds_its_gradient_and_returns_the_squared_norm(dev, dtype):
    rng = np.random.default_rng(0)
    ws = [rng.normal(size=s).astype(dtype) for s in [(3, 4), (2, 3)]]
    gs = [rng.normal(size=w.shape).astype(dtype) for w in ws]
    params = [dev.param(w) for w in ws]
    for p, g in zip(params, gs):
        p.grad = dev.tensor(g)
    sq = _add_l2(params, 0.25)
    tol = {"rtol": 1e-6} if dtype == np.float32 else {"rtol": 1e-14}
    np.testing.assert_allclose(sq, sum(float((w.astype(np.float64) ** 2).sum()) for w in ws),
                               **tol)
    for p, w, g in zip(params, ws, gs):
        np.testing.assert_allclose(dev.host(p.grad), g + dtype(0.25) * w, **tol)
        np.testing.assert_array_equal(p.numpy(), w)      # the weights are left alone
