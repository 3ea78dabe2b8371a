"""numbagrad.sklearn: drop-in MLPClassifier / MLPRegressor for scikit-learn's."""
import pickle
import sys
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn import neural_network as sk
from sklearn.datasets import load_digits, make_classification, make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.utils.estimator_checks import parametrize_with_checks

from numbagrad.sklearn import MLPClassifier, MLPRegressor


# The whole scikit-learn estimator suite, default arguments, no expected failures.
@parametrize_with_checks([MLPClassifier(random_state=0), MLPRegressor(random_state=0)])
def test_sklearn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check(estimator)


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return train_test_split(X / 16, y, test_size=0.25, stratify=y, random_state=0)


def _fit(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = time.perf_counter()
        est.fit(X, y)
        return time.perf_counter() - start


def test_digits_accuracy_matches_scikit_learn(digits):
    Xtr, Xte, ytr, yte = digits
    settings = {"hidden_layer_sizes": (64,), "random_state": 0, "max_iter": 200}
    ours, theirs = MLPClassifier(**settings), sk.MLPClassifier(**settings)
    t_ours, t_theirs = _fit(ours, Xtr, ytr), _fit(theirs, Xtr, ytr)
    acc_ours, acc_theirs = ours.score(Xte, yte), theirs.score(Xte, yte)
    print(f"digits: numbagrad {acc_ours:.4f} in {t_ours:.2f}s, "
          f"scikit-learn {acc_theirs:.4f} in {t_theirs:.2f}s")
    assert abs(acc_ours - acc_theirs) <= 0.01
    assert ours.n_iter_ == theirs.n_iter_
    assert ours.coefs_[0].dtype == np.float64


@pytest.mark.parametrize("kw", [{}, {"activation": "tanh"},
                                {"activation": "logistic", "alpha": 0.1},
                                {"early_stopping": True}])
def test_training_tracks_scikit_learn(digits, kw):
    # Same init draws, same shuffles, same loss: the curves agree closely.
    Xtr, _, ytr, _ = digits
    settings = dict(hidden_layer_sizes=(16,), random_state=0, max_iter=4, **kw)
    ours = MLPClassifier(**settings)
    theirs = sk.MLPClassifier(**settings)
    _fit(ours, Xtr, ytr)
    _fit(theirs, Xtr, ytr)
    np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=1e-3)
    if kw.get("early_stopping"):
        np.testing.assert_allclose(ours.validation_scores_, theirs.validation_scores_,
                                   atol=0.02)


def test_binary_multilabel_and_regression_track_scikit_learn():
    X, y = make_classification(120, 6, random_state=0)
    Y = np.stack([y, 1 - y, X[:, 0] > 0], axis=1).astype(int)
    Xr, yr = make_regression(120, 5, n_targets=2, random_state=0, noise=1.0)
    yr = yr / 100
    cases = [(MLPClassifier, sk.MLPClassifier, X, y, {}),
             (MLPClassifier, sk.MLPClassifier, X, Y, {}),
             (MLPRegressor, sk.MLPRegressor, Xr, yr, {}),
             (MLPRegressor, sk.MLPRegressor, Xr, np.abs(yr[:, 0]) * 3, {"loss": "poisson"})]
    for ours_cls, theirs_cls, Xc, yc, kw in cases:
        settings = dict(hidden_layer_sizes=(8,), random_state=0, max_iter=3, **kw)
        ours, theirs = ours_cls(**settings), theirs_cls(**settings)
        _fit(ours, Xc, yc)
        _fit(theirs, Xc, yc)
        np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=1e-4)
        assert ours.predict(Xc).shape == theirs.predict(Xc).shape
        assert ours.out_activation_ == theirs.out_activation_
        if ours_cls is MLPClassifier:
            assert ours.predict_proba(Xc).shape == theirs.predict_proba(Xc).shape
            np.testing.assert_array_equal(ours.classes_, theirs.classes_)


def test_convergence_rule_and_warning_match_scikit_learn():
    X, y = make_classification(100, 5, random_state=1)
    for kw in [{"tol": 10.0}, {"tol": 0.0, "max_iter": 7}]:
        ours = MLPClassifier(hidden_layer_sizes=(4,), random_state=0, **kw)
        theirs = sk.MLPClassifier(hidden_layer_sizes=(4,), random_state=0, **kw)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours.fit(X, y)
        _fit(theirs, X, y)
        assert ours.n_iter_ == theirs.n_iter_
        warned = any(issubclass(w.category, ConvergenceWarning) for w in caught)
        assert warned == (ours.n_iter_ == ours.max_iter)


def test_accumulation_gives_the_same_updates():
    X, y = make_classification(90, 6, n_classes=3, n_informative=4, random_state=0)
    base = {"hidden_layer_sizes": (8,), "batch_size": 20, "random_state": 0, "max_iter": 6}
    ref = MLPClassifier(**base)
    _fit(ref, X, y)
    for k in (2, 3, 7, 25):   # 25 > batch size: some micro-batches are empty
        acc = MLPClassifier(accumulate_steps=k, **base)
        _fit(acc, X, y)
        for a, b in zip(acc.coefs_ + acc.intercepts_, ref.coefs_ + ref.intercepts_):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=f"k={k}")
        np.testing.assert_allclose(acc.loss_curve_, ref.loss_curve_, rtol=1e-12)


def test_partial_fit_pickle_and_resume_are_exact():
    X, y = make_regression(60, 4, random_state=0)
    a = MLPRegressor(hidden_layer_sizes=(6,), random_state=0, batch_size=16)
    b = MLPRegressor(hidden_layer_sizes=(6,), random_state=0, batch_size=16)
    for _ in range(3):
        a.partial_fit(X, y)
        b.partial_fit(X, y)
    b = pickle.loads(pickle.dumps(b))   # the Adam state travels with it
    for _ in range(3):
        a.partial_fit(X, y)
        b.partial_fit(X, y)
    for p, q in zip(a.coefs_ + a.intercepts_, b.coefs_ + b.intercepts_):
        np.testing.assert_array_equal(p, q)
    assert a.n_iter_ == b.n_iter_ == 6 and a.loss_curve_ == b.loss_curve_


def test_partial_fit_classes_and_warm_start():
    X, y = make_classification(80, 5, n_classes=3, n_informative=3, random_state=0)
    clf = MLPClassifier(hidden_layer_sizes=(5,), random_state=0)
    with pytest.raises(ValueError, match="classes must be passed"):
        clf.partial_fit(X, y)
    clf.partial_fit(X[y < 2], y[y < 2], classes=[0, 1, 2])   # a class may be absent
    assert list(clf.classes_) == [0, 1, 2] and clf.n_iter_ == 1
    clf.partial_fit(X, y)
    assert clf.n_iter_ == 2 and len(clf.loss_curve_) == 2

    warm = MLPClassifier(hidden_layer_sizes=(5,), random_state=0, max_iter=3, warm_start=True)
    _fit(warm, X, y)
    first = [c.copy() for c in warm.coefs_]
    _fit(warm, X, y)
    assert warm.n_iter_ == 6 and len(warm.loss_curve_) == 6
    assert not np.array_equal(first[0], warm.coefs_[0])
    with pytest.raises(ValueError, match="warm_start"):
        warm.fit(X[y < 2], y[y < 2])


def test_dtype_and_float32_input():
    X, y = make_classification(60, 4, random_state=0)
    kept = MLPClassifier(hidden_layer_sizes=(4,), random_state=0, max_iter=2)
    _fit(kept, X.astype(np.float32), y)
    assert kept.coefs_[0].dtype == np.float32
    forced = MLPClassifier(hidden_layer_sizes=(4,), random_state=0, max_iter=2, dtype="float32")
    _fit(forced, X, y)
    assert forced.coefs_[0].dtype == np.float32
    assert forced.predict_proba(X).shape == (60, 2)
    np.testing.assert_allclose(forced.loss_curve_, kept.loss_curve_, rtol=1e-6)


@pytest.mark.parametrize("name, value", [
    ("solver", "sgd"), ("activation", "softplus"), ("alpha", -1.0), ("batch_size", 0),
    ("learning_rate_init", 0.0), ("max_iter", 0), ("validation_fraction", 1.0),
    ("n_iter_no_change", 0), ("accumulate_steps", 0), ("dtype", "int32"),
    ("device", "tpu"), ("hidden_layer_sizes", (4, 0)), ("beta_1", 1.0)])
def test_invalid_parameters_raise_at_fit(name, value):
    X, y = make_classification(20, 3, n_informative=2, n_redundant=0, random_state=0)
    clf = MLPClassifier(**{name: value})
    with pytest.raises(ValueError, match=name if name != "hidden_layer_sizes" else "> 0"):
        clf.fit(X, y)


def test_verbose_shows_a_progress_bar_or_plain_lines(capsys, monkeypatch):
    X, y = make_classification(40, 3, n_informative=2, n_redundant=0, random_state=0)
    pytest.importorskip("tqdm")
    _fit(MLPClassifier(hidden_layer_sizes=(3,), max_iter=3, verbose=True, random_state=0),
         X, y)
    out = capsys.readouterr().out
    assert "MLPClassifier" in out and "3/3" in out and "loss=" in out

    monkeypatch.setitem(sys.modules, "tqdm.auto", None)   # as if tqdm were not installed
    _fit(MLPClassifier(hidden_layer_sizes=(3,), max_iter=3, verbose=True, random_state=0),
         X, y)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [f"Iteration {i}, loss = {lines[i - 1].split('= ')[1]}"
                         for i in (1, 2, 3)]


def test_cuda_device_trains(dev):
    X, y = make_classification(12, 3, n_informative=2, n_redundant=0, random_state=0)
    kw = {"hidden_layer_sizes": (3,), "max_iter": 2, "random_state": 0, "accumulate_steps": 2}
    on_dev = MLPClassifier(device=dev.name, **kw)
    on_cpu = MLPClassifier(**kw)
    _fit(on_dev, X, y)
    _fit(on_cpu, X, y)
    np.testing.assert_allclose(on_dev.loss_curve_, on_cpu.loss_curve_, rtol=1e-9)
    for a, b in zip(on_dev.coefs_, on_cpu.coefs_):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert isinstance(on_dev.predict(X), np.ndarray)


def test_non_finite_weights_raise_like_scikit_learn():
    X = np.full((20, 3), 1e200)
    X[::2] *= -1
    y = np.arange(20.0) * 1e200
    for cls in (MLPRegressor, sk.MLPRegressor):
        with pytest.raises(ValueError, match="non-finite parameter weights"), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls(max_iter=3, random_state=0).fit(X, y)
