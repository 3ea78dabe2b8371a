"""scikit-learn estimators trained by numbagrad: ``MLPClassifier``, ``MLPRegressor``.

Drop-in for ``sklearn.neural_network.MLPClassifier`` / ``MLPRegressor`` with
the Adam solver: the same constructor parameters and defaults where they
apply, the same loss (data loss plus ``0.5 * alpha * ||W||^2 / n_batch`` over
the weights), Glorot-uniform initialisation drawn from ``random_state`` in
scikit-learn's order, the same shuffling, batching, early stopping and
``tol`` / ``n_iter_no_change`` convergence rule, and the same fitted
attributes (``coefs_``, ``intercepts_``, ``loss_curve_``, ``n_iter_``,
``classes_``...). The forward and backward passes run on numbagrad's Numba
kernels; ``predict`` uses ``coefs_`` with NumPy, as scikit-learn does.
One known difference: the Adam update is PyTorch's (``eps`` added to
``sqrt(v_hat)``), scikit-learn's adds ``eps`` to ``sqrt(v)``, which only
matters while ``v`` is of the order of ``eps**2``.

Three extra parameters:

- ``accumulate_steps`` (default 1) splits every batch into that many
  micro-batches whose gradients are accumulated before the one update, so
  the updates are those of ``accumulate_steps=1`` (up to rounding) with a
  smaller peak memory.
- ``dtype`` (default None: the input's, float32 kept, anything else float64,
  as scikit-learn does) forces float32 or float64 training.
- ``device`` ("cpu" or "cuda") is where training runs.

Sparse ``X`` is accepted (as scikit-learn's MLPs do) and densified for
training. While the layers are small (under ~4M multiply-adds per GEMM)
``fit`` runs the BLAS on one thread, which is faster for them and immune to
a busy machine's descheduled BLAS threads.

Needs scikit-learn >= 1.6 (``pip install numbagrad[sklearn]``); ``verbose``
shows a tqdm progress bar when tqdm is installed and plain per-epoch lines
otherwise.
"""
from __future__ import annotations

import contextlib
import itertools
import numbers
import sys
import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp
from numba import njit
from scipy.special import expit, xlogy
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, is_classifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import LabelBinarizer
from sklearn.utils import check_random_state, column_or_1d
from sklearn.utils.multiclass import check_classification_targets, type_of_target, unique_labels
from sklearn.utils.validation import check_is_fitted, validate_data
from threadpoolctl import ThreadpoolController

from . import nn, ops, optim
from .tape import grad_tape
from .tensor import as_tensor, tensor

__all__ = ["MLPClassifier", "MLPRegressor"]

_FLOATS = (np.dtype(np.float64), np.dtype(np.float32))
_ACTIVATIONS = ("identity", "logistic", "tanh", "relu")
_TAPE_ACT = {"identity": None, "logistic": ops.sigmoid, "tanh": ops.tanh, "relu": ops.relu}


# ------------------------------------------------------------- host maths
def _inplace_act(name: str, a: np.ndarray) -> np.ndarray:
    if name == "relu":
        np.maximum(a, 0, out=a)
    elif name == "tanh":
        np.tanh(a, out=a)
    elif name == "logistic":
        expit(a, out=a)
    elif name == "exp":
        np.exp(a, out=a)
    elif name == "softmax":
        a -= a.max(axis=1, keepdims=True)
        np.exp(a, out=a)
        a /= a.sum(axis=1, keepdims=True)
    return a


_controller = None
_SMALL_GEMM = 1 << 22   # multiply-adds per GEMM below which one BLAS thread is faster


def _small_blas(work: int) -> Any:
    """One BLAS thread while the layers are small: OpenBLAS's pool costs more
    than it gains on them, and on a busy machine it waits for descheduled
    threads (several-fold slower). Larger layers keep every thread."""
    global _controller
    if work >= _SMALL_GEMM:
        return contextlib.nullcontext()
    if _controller is None:
        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


@njit(cache=True)
def _l2_into_grad(w, g, c):   # pragma: no cover (compiled)
    """g += c * w over one weight matrix; returns sum(w * w). One pass, and no
    NumPy BLAS call (which would wake a second thread pool beside the kernels')."""
    ws = w.ravel()
    gs = g.ravel()
    total = 0.0
    for i in range(ws.size):
        v = ws[i]
        total += v * v
        gs[i] += c * v
    return total


def _dense(X: Any) -> np.ndarray:
    return X.toarray() if sp.issparse(X) else X


# ------------------------------------------------------- param validation
def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _bad(name: str, rule: str, value: Any) -> ValueError:
    return ValueError(f"The {name!r} parameter must be {rule}. Got {value!r} instead.")


class _BaseMLP(BaseEstimator):
    """Shared training loop; use MLPClassifier or MLPRegressor."""

    _loss_options: tuple[str, ...] = ()

    # ---------------------------------------------------------- params
    def _checked_params(self) -> list[int]:
        """Validate the constructor parameters (at fit, as scikit-learn does);
        return the hidden layer sizes as a list."""
        sizes = self.hidden_layer_sizes
        sizes = list(sizes) if hasattr(sizes, "__iter__") else [sizes]
        if not all(_is_int(s) for s in sizes):
            raise _bad("hidden_layer_sizes", "an int or a sequence of ints",
                       self.hidden_layer_sizes)
        if any(s <= 0 for s in sizes):
            raise ValueError(f"hidden_layer_sizes must be > 0, got {sizes}.")
        checks = [
            ("activation", self.activation in _ACTIVATIONS, f"one of {_ACTIVATIONS}"),
            ("solver", self.solver == "adam", "'adam' (numbagrad's MLPs train with Adam only)"),
            ("alpha", _is_real(self.alpha) and self.alpha >= 0, "a real number >= 0"),
            ("batch_size", self.batch_size == "auto" if isinstance(self.batch_size, str)
             else _is_int(self.batch_size) and self.batch_size >= 1, "'auto' or an int >= 1"),
            ("learning_rate_init", _is_real(self.learning_rate_init)
             and self.learning_rate_init > 0, "a real number > 0"),
            ("max_iter", _is_int(self.max_iter) and self.max_iter >= 1, "an int >= 1"),
            ("shuffle", isinstance(self.shuffle, (bool, np.bool_)), "a bool"),
            ("tol", _is_real(self.tol) and self.tol >= 0, "a real number >= 0"),
            ("verbose", isinstance(self.verbose, (bool, np.bool_)) or _is_int(self.verbose),
             "a bool or an int"),
            ("warm_start", isinstance(self.warm_start, (bool, np.bool_)), "a bool"),
            ("early_stopping", isinstance(self.early_stopping, (bool, np.bool_)), "a bool"),
            ("validation_fraction", _is_real(self.validation_fraction)
             and 0 <= self.validation_fraction < 1, "a real number in [0, 1)"),
            ("beta_1", _is_real(self.beta_1) and 0 <= self.beta_1 < 1, "a real number in [0, 1)"),
            ("beta_2", _is_real(self.beta_2) and 0 <= self.beta_2 < 1, "a real number in [0, 1)"),
            ("epsilon", _is_real(self.epsilon) and self.epsilon > 0, "a real number > 0"),
            ("n_iter_no_change", (_is_int(self.n_iter_no_change) and self.n_iter_no_change >= 1)
             or self.n_iter_no_change == np.inf, "an int >= 1 or numpy.inf"),
            ("accumulate_steps", _is_int(self.accumulate_steps) and self.accumulate_steps >= 1,
             "an int >= 1"),
            ("device", self.device in ("cpu", "cuda"), "'cpu' or 'cuda'"),
        ]
        if self._loss_options:
            checks.append(("loss", self.loss in self._loss_options,
                           f"one of {self._loss_options}"))
        for name, ok, rule in checks:
            if not ok:
                raise _bad(name, rule, getattr(self, name))
        if self.dtype is not None:
            try:
                ok = np.dtype(self.dtype) in _FLOATS
            except TypeError:
                ok = False
            if not ok:
                raise _bad("dtype", "None, 'float32' or 'float64'", self.dtype)
        return sizes

    # ------------------------------------------------------------ fit
    def _fit(self, X: Any, y: Any, incremental: bool) -> _BaseMLP:
        hidden = self._checked_params()
        first_pass = not hasattr(self, "coefs_") or (not self.warm_start and not incremental)
        X, Y = self._validate_input(X, y, incremental, reset=first_pass)
        if self.dtype is not None:
            dtype = np.dtype(self.dtype)
        elif first_pass:
            dtype = X.dtype
        else:
            dtype = self.coefs_[0].dtype
        X = _dense(X)
        if not (type(X) is np.ndarray and X.dtype == dtype and X.flags.c_contiguous
                and X.flags.writeable):
            X = np.array(X, dtype=dtype, order="C")
        if Y.ndim == 1:
            Y = Y.reshape((-1, 1))
        self.n_outputs_ = Y.shape[1]
        layer_units = [X.shape[1], *hidden, self.n_outputs_]

        self._random_state = check_random_state(self.random_state)
        if first_pass:
            self._initialize(Y, layer_units, dtype)
        elif [c.shape for c in self.coefs_] != list(itertools.pairwise(layer_units)):
            raise ValueError(f"the fitted layers {[c.shape for c in self.coefs_]} do not match "
                             f"hidden_layer_sizes={hidden} for this data")
        self._fit_stochastic(X, Y, dtype, incremental)
        if not all(np.isfinite(w).all() for w in (*self.coefs_, *self.intercepts_)):
            raise ValueError("Solver produced non-finite parameter weights. The input data may "
                             "contain large values and need to be preprocessed.")
        return self

    def _initialize(self, Y: np.ndarray, layer_units: list[int], dtype: np.dtype) -> None:
        self.n_iter_ = 0
        self.t_ = 0
        self.n_layers_ = len(layer_units)
        self.out_activation_ = self._out_activation()
        self.coefs_, self.intercepts_ = [], []
        factor = 2.0 if self.activation == "logistic" else 6.0
        for fan_in, fan_out in itertools.pairwise(layer_units):
            bound = np.sqrt(factor / (fan_in + fan_out))   # Glorot, as scikit-learn
            coef = self._random_state.uniform(-bound, bound, (fan_in, fan_out))
            intercept = self._random_state.uniform(-bound, bound, fan_out)
            self.coefs_.append(coef.astype(dtype, copy=False))
            self.intercepts_.append(intercept.astype(dtype, copy=False))
        self._best_coefs = [c.copy() for c in self.coefs_]
        self._best_intercepts = [i.copy() for i in self.intercepts_]
        self.loss_curve_ = []
        self._no_improvement_count = 0
        if self.early_stopping:
            self.validation_scores_ = []
            self.best_validation_score_ = -np.inf
            self.best_loss_ = None
        else:
            self.best_loss_ = np.inf
            self.validation_scores_ = None
            self.best_validation_score_ = None
        self._model = self._optimizer = None
        self.__dict__.pop("_optimizer_state", None)

    # ------------------------------------------------- numbagrad model
    def _sync_model(self, dtype: np.dtype, incremental: bool) -> None:
        """Load ``coefs_`` into the numbagrad layers (built when missing or of
        another shape, dtype or device) and make the optimizer."""
        shapes = [(c.shape[1], c.shape[0]) for c in self.coefs_]
        model = getattr(self, "_model", None)
        if model is None or [lin.weight.shape for lin in model] != shapes \
                or model[0].weight.dtype != dtype or model[0].weight.device != self.device:
            rng = np.random.default_rng(0)   # overwritten below by coefs_
            model = nn.Sequential(*[nn.Linear(i, o, dtype=dtype, device=self.device, rng=rng)
                                    for o, i in shapes])
            self._model, self._optimizer = model, None
        model.load_state_dict({
            **{f"{i}.weight": np.ascontiguousarray(c.T, dtype) for i, c in enumerate(self.coefs_)},
            **{f"{i}.bias": np.asarray(b, dtype) for i, b in enumerate(self.intercepts_)}})
        k = self.accumulate_steps
        opt = getattr(self, "_optimizer", None)
        saved = self.__dict__.pop("_optimizer_state", None)
        if incremental and opt is not None and opt.accumulate_steps == k \
                and opt.pending_steps == 0:
            return
        # nonfinite="ignore": no per-update scan; like scikit-learn, fit checks the
        # weights once at the end ("Solver produced non-finite parameter weights").
        opt = optim.Adam(model.parameters(), lr=self.learning_rate_init,
                         betas=(self.beta_1, self.beta_2), eps=self.epsilon,
                         accumulate_steps=k, average=False, nonfinite="ignore")
        if incremental and saved is not None:   # partial_fit after unpickling
            try:
                opt.load_state_dict(saved)
            except ValueError:
                pass
        self._optimizer = opt

    def _pull(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The layers' current weights in scikit-learn's layout."""
        coefs = [np.ascontiguousarray(lin.weight.numpy().T) for lin in self._model]
        intercepts = [lin.bias.numpy() for lin in self._model]
        return coefs, intercepts

    # ----------------------------------------------------- the loop
    def _fit_stochastic(self, X: np.ndarray, Y: np.ndarray, dtype: np.dtype,
                        incremental: bool) -> None:
        if self.early_stopping and incremental:
            raise ValueError("partial_fit does not support early_stopping=True")
        self._sync_model(dtype, incremental)
        early_stopping = self.early_stopping
        if early_stopping:
            stratify = Y if is_classifier(self) and self.n_outputs_ == 1 else None
            X_train, X_val, Y_train, Y_val = train_test_split(
                X, Y, random_state=self._random_state, test_size=self.validation_fraction,
                stratify=stratify)
            if X_val.shape[0] < 2:
                raise ValueError("The validation set is too small. Increase "
                                 "'validation_fraction' or the size of your dataset.")
            if is_classifier(self):
                Y_val = self._label_binarizer.inverse_transform(Y_val)
        else:
            X_train, Y_train, X_val, Y_val = X, Y, None, None
        T_train = self._targets(Y_train, dtype)
        loss_offset = self._loss_offset(Y_train)

        n_samples = X_train.shape[0]
        if self.batch_size == "auto":
            batch_size = min(200, n_samples)
        else:
            if self.batch_size > n_samples:
                warnings.warn("Got `batch_size` less than 1 or larger than sample size. It is "
                              "going to be clipped", stacklevel=3)
            batch_size = int(np.clip(self.batch_size, 1, n_samples))
        batches = [(s, min(s + batch_size, n_samples)) for s in range(0, n_samples, batch_size)]
        k = self.accumulate_steps
        # each batch is one optimizer window of k micro-batches: (start, micro-batch ends)
        windows = [(lo, [lo + (hi - lo) * (j + 1) // k for j in range(k)]) for lo, hi in batches]
        sample_idx = np.arange(n_samples)
        bar = self._progress(incremental)
        rows = max(cuts[0] - lo for lo, cuts in windows)
        limit = _small_blas(rows * max(c.size for c in self.coefs_)) \
            if self.device == "cpu" else contextlib.nullcontext()
        try:
            limit.__enter__()
            for _ in range(self.max_iter):
                if self.shuffle:
                    # sklearn.utils.shuffle(sample_idx, random_state=...), without its
                    # per-call input checks: the same draws, so the same batches
                    perm = np.arange(n_samples)
                    self._random_state.shuffle(perm)
                    sample_idx = sample_idx[perm]
                    Xe, Te = X_train[sample_idx], T_train[sample_idx]
                else:
                    Xe, Te = X_train, T_train
                total = self._epoch(Xe, Te, windows, dtype)
                self.n_iter_ += 1
                self.loss_ = total / n_samples + loss_offset
                self.t_ += n_samples
                self.loss_curve_.append(self.loss_)
                self._report(bar, f"Iteration {self.n_iter_}, loss = {self.loss_:.8f}")
                self._update_no_improvement_count(early_stopping, X_val, Y_val, bar)
                if self._no_improvement_count > self.n_iter_no_change:
                    what = "Validation score" if early_stopping else "Training loss"
                    self._report(bar, f"{what} did not improve more than tol={self.tol:f} for "
                                      f"{self.n_iter_no_change} consecutive epochs. Stopping.",
                                 always=True)
                    break
                if incremental:
                    break
                if self.n_iter_ == self.max_iter:
                    warnings.warn(f"Stochastic Optimizer: Maximum iterations ({self.max_iter}) "
                                  "reached and the optimization hasn't converged yet.",
                                  ConvergenceWarning, stacklevel=3)
        except KeyboardInterrupt:
            warnings.warn("Training interrupted by user.", stacklevel=3)
            if self._optimizer is not None and self._optimizer.pending_steps:
                self._optimizer = None   # a half-done window is not resumed
        finally:
            limit.__exit__(None, None, None)
            if bar is not None:
                bar.close()
        self.coefs_, self.intercepts_ = self._pull()
        if early_stopping:
            self.coefs_, self.intercepts_ = self._best_coefs, self._best_intercepts

    def _epoch(self, Xe: np.ndarray, Te: np.ndarray, windows: list, dtype: np.dtype) -> float:
        """One pass over the (shuffled) data; returns the summed loss."""
        opt = self._optimizer
        layers = [(lin.weight, lin.bias) for lin in self._model]
        weights = [w for w, _ in layers]
        linear = ops.linear
        act = _TAPE_ACT[self.activation]
        last = len(layers) - 1
        loss_fn = self._tape_loss
        alpha = float(self.alpha)
        on_cpu = self.device == "cpu"
        report_scale = self._report_scale()
        if not on_cpu:   # one upload per epoch; micro-batches are views
            Xe = tensor(Xe, device=self.device).data
            if Te.dtype.kind == "f":
                Te = tensor(Te, device=self.device).data
        total = 0.0
        for lo, cuts in windows:
            n = cuts[-1] - lo
            scale = 1.0 / n
            batch_loss = 0.0
            start = lo
            l2 = bool(alpha)   # the penalty's gradient goes into each window once
            for stop in cuts:
                if stop == start:      # fewer samples than micro-batches
                    opt.step()
                    continue
                with grad_tape():
                    h = as_tensor(Xe[start:stop])
                    for i, (w, b) in enumerate(layers):
                        h = linear(h, w, b)
                        if i < last and act is not None:
                            h = act(h)
                    loss = loss_fn(h, Te[start:stop], scale, len(cuts) == 1)
                    penalty = None
                    if l2 and not on_cpu:
                        penalty = sum(ops.sum(w * w) for w in weights) * (0.5 * alpha * scale)
                        loss = loss + penalty
                loss.backward()
                batch_loss += loss.item() * report_scale
                if l2:
                    l2 = False
                    if on_cpu:   # d/dW of 0.5 * alpha * ||W||^2 / n
                        sq = 0.0
                        for w in weights:
                            sq += _l2_into_grad(w.data, w.grad, alpha * scale)
                        batch_loss += 0.5 * alpha * sq * scale
                    else:
                        pen = penalty.item()
                        batch_loss += pen * (1.0 - report_scale)
                opt.step()
                start = stop
            total += batch_loss * n
        return total

    # ------------------------------------------------ progress, stopping
    def _progress(self, incremental: bool) -> Any:
        if not self.verbose:
            return None
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return None
        return tqdm(total=1 if incremental else self.max_iter, desc=type(self).__name__,
                    unit="epoch", file=sys.stdout, dynamic_ncols=True)

    def _report(self, bar: Any, line: str, always: bool = False) -> None:
        if not self.verbose:
            return
        if bar is None:
            print(line)
            return
        if always:
            bar.write(line, file=sys.stdout)
        else:
            bar.update(1)
            bar.set_postfix(loss=f"{self.loss_:.6f}", refresh=False)

    def _update_no_improvement_count(self, early_stopping: bool, X_val: Any, Y_val: Any,
                                     bar: Any) -> None:
        if early_stopping:
            coefs, intercepts = self._pull()
            score = self._score_with(X_val, Y_val, coefs, intercepts)
            self.validation_scores_.append(score)
            if self.verbose:
                if bar is None:
                    print(f"Validation score: {score:f}")
                else:
                    bar.set_postfix(loss=f"{self.loss_:.6f}", val=f"{score:.6f}")
            if score < self.best_validation_score_ + self.tol:
                self._no_improvement_count += 1
            else:
                self._no_improvement_count = 0
            if score > self.best_validation_score_:
                self.best_validation_score_ = score
                self._best_coefs, self._best_intercepts = coefs, intercepts
        else:
            if self.loss_curve_[-1] > self.best_loss_ - self.tol:
                self._no_improvement_count += 1
            else:
                self._no_improvement_count = 0
            self.best_loss_ = min(self.best_loss_, self.loss_curve_[-1])

    # -------------------------------------------------------- predict
    def _forward_pass_fast(self, X: Any, check_input: bool = True,
                           coefs: list | None = None, intercepts: list | None = None
                           ) -> np.ndarray:
        if check_input:
            X = validate_data(self, X, accept_sparse=["csr", "csc"], reset=False,
                              dtype=(np.float64, np.float32))
        coefs = self.coefs_ if coefs is None else coefs
        intercepts = self.intercepts_ if intercepts is None else intercepts
        a = X
        last = len(coefs) - 1
        for i, (w, b) in enumerate(zip(coefs, intercepts)):
            a = a @ w
            a = np.asarray(a) + b
            _inplace_act(self.activation if i < last else self.out_activation_, a)
        return a

    # ------------------------------------------------------- pickling
    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())
        state.pop("_model", None)
        opt = state.pop("_optimizer", None)
        if opt is not None and opt.pending_steps == 0:
            state["_optimizer_state"] = opt.state_dict()
        return state

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    # ------------------------------------------------ per-task hooks
    def _out_activation(self) -> str:
        raise NotImplementedError

    def _targets(self, Y: np.ndarray, dtype: np.dtype) -> np.ndarray:
        raise NotImplementedError

    def _loss_offset(self, Y: np.ndarray) -> float:
        return 0.0

    def _report_scale(self) -> float:
        return 1.0

    def _tape_loss(self, out: Any, target: Any, scale: float, whole_batch: bool) -> Any:
        raise NotImplementedError


_COMMON_DOC = """
    Parameters
    ----------
    hidden_layer_sizes : array-like of shape (n_layers - 2,), default=(100,)
    activation : {'identity', 'logistic', 'tanh', 'relu'}, default='relu'
    solver : {'adam'}, default='adam'
        Only Adam (PyTorch's formulas) is available.
    alpha : float, default=0.0001
        L2 penalty: ``0.5 * alpha * ||W||^2 / n_samples_in_batch`` over the weights.
    batch_size : int or 'auto', default='auto' (``min(200, n_samples)``)
    learning_rate_init : float, default=0.001
    max_iter : int, default=200
        Epochs (``partial_fit`` runs one).
    shuffle : bool, default=True
    random_state : int, RandomState instance or None, default=None
    tol : float, default=1e-4
    verbose : bool, default=False
        A tqdm progress bar when tqdm is installed, else one line per epoch.
    warm_start : bool, default=False
    early_stopping : bool, default=False
    validation_fraction : float, default=0.1
    beta_1, beta_2, epsilon : float, default=0.9, 0.999, 1e-8
    n_iter_no_change : int, default=10
    accumulate_steps : int, default=1
        Micro-batches per batch, their gradients accumulated into one update.
    dtype : None, 'float32' or 'float64', default=None
        None trains in the input's dtype: float32 stays float32, anything else
        float64 (as scikit-learn does).
    device : {'cpu', 'cuda'}, default='cpu'

    Attributes
    ----------
    coefs_, intercepts_, loss_, loss_curve_, best_loss_, validation_scores_,
    best_validation_score_, t_, n_iter_, n_layers_, n_outputs_, out_activation_,
    n_features_in_, feature_names_in_ : as scikit-learn's.
"""


class MLPClassifier(ClassifierMixin, _BaseMLP):
    """Multi-layer perceptron classifier trained with Adam by numbagrad.

    Log-loss with a softmax output for multiclass targets, a logistic output
    for binary and multilabel ones (as scikit-learn's ``MLPClassifier``).
    """

    __doc__ += _COMMON_DOC + "    classes_ : ndarray of the class labels.\n"

    def __init__(self, hidden_layer_sizes=(100,), activation="relu", *, solver="adam",
                 alpha=0.0001, batch_size="auto", learning_rate_init=0.001, max_iter=200,
                 shuffle=True, random_state=None, tol=1e-4, verbose=False, warm_start=False,
                 early_stopping=False, validation_fraction=0.1, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-8, n_iter_no_change=10, accumulate_steps=1, dtype=None,
                 device="cpu"):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate_init = learning_rate_init
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.warm_start = warm_start
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.n_iter_no_change = n_iter_no_change
        self.accumulate_steps = accumulate_steps
        self.dtype = dtype
        self.device = device

    def fit(self, X, y):
        """Fit the model to ``X`` (n_samples, n_features) and labels ``y``."""
        return self._fit(X, y, incremental=False)

    def partial_fit(self, X, y, classes=None):
        """One epoch over ``X, y``; ``classes`` is required on the first call."""
        if not hasattr(self, "classes_"):
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit.")
            self._label_binarizer = LabelBinarizer()
            if type_of_target(y).startswith("multilabel"):
                self._label_binarizer.fit(y)
            else:
                self._label_binarizer.fit(classes)
            self.classes_ = self._label_binarizer.classes_
        elif classes is not None and not np.array_equal(np.unique(classes), self.classes_):
            raise ValueError(f"`classes={classes!r}` is not the same as on last call to "
                             f"partial_fit, was: {self.classes_!r}")
        return self._fit(X, y, incremental=True)

    def _validate_input(self, X, y, incremental, reset):
        X, y = validate_data(self, X, y, accept_sparse=["csr", "csc"], multi_output=True,
                             dtype=(np.float64, np.float32), reset=reset)
        if y.ndim == 2 and y.shape[1] == 1:
            y = column_or_1d(y, warn=True)
        check_classification_targets(y)
        if not hasattr(self, "classes_") or (not self.warm_start and not incremental):
            self._label_binarizer = LabelBinarizer()
            self._label_binarizer.fit(y)
            self.classes_ = self._label_binarizer.classes_
        else:
            classes = unique_labels(y)
            if self.warm_start:
                if set(classes) != set(self.classes_):
                    raise ValueError("warm_start can only be used where `y` has the same "
                                     "classes as in the previous call to fit. Previously "
                                     f"got {self.classes_}, `y` has {classes}")
            elif len(np.setdiff1d(classes, self.classes_, assume_unique=True)):
                raise ValueError("`y` has classes not in `self.classes_`. "
                                 f"`self.classes_` has {self.classes_}. 'y' has {classes}.")
        return X, self._label_binarizer.transform(y).astype(bool)

    def _out_activation(self) -> str:
        return "softmax" if self._label_binarizer.y_type_ == "multiclass" else "logistic"

    def _targets(self, Y: np.ndarray, dtype: np.dtype) -> np.ndarray:
        if self.out_activation_ == "softmax":
            return np.ascontiguousarray(Y.argmax(axis=1), dtype=np.int64)
        return np.ascontiguousarray(Y, dtype=dtype)

    def _tape_loss(self, out, target, scale, whole_batch):
        if self.out_activation_ == "softmax":
            if whole_batch:
                return ops.cross_entropy(out, target)
            return ops.cross_entropy(out, target, reduction="sum") * scale
        if whole_batch and out.shape[1] == 1:
            return ops.binary_cross_entropy_with_logits(out, as_tensor(target))
        return ops.binary_cross_entropy_with_logits(out, as_tensor(target),
                                                    reduction="sum") * scale

    def predict(self, X):
        """Predicted class labels (an indicator matrix for multilabel targets)."""
        check_is_fitted(self)
        return self._predict(X)

    def _predict(self, X, check_input=True, coefs=None, intercepts=None):
        y_pred = self._forward_pass_fast(X, check_input, coefs, intercepts)
        if self.n_outputs_ == 1:
            y_pred = y_pred.ravel()
        return self._label_binarizer.inverse_transform(y_pred)

    def _score_with(self, X, y, coefs, intercepts) -> float:
        y_pred = self._forward_pass_fast(X, False, coefs, intercepts)
        if not np.isfinite(y_pred).all():
            return np.nan
        if self.n_outputs_ == 1:
            y_pred = y_pred.ravel()
        y_pred = self._label_binarizer.inverse_transform(y_pred)
        from sklearn.metrics import accuracy_score
        return accuracy_score(y, y_pred)

    def predict_proba(self, X):
        """Class probabilities, columns in the order of ``classes_``."""
        check_is_fitted(self)
        y_pred = self._forward_pass_fast(X)
        if self.n_outputs_ == 1:
            y_pred = y_pred.ravel()
        if y_pred.ndim == 1:
            return np.vstack([1 - y_pred, y_pred]).T
        return y_pred

    def predict_log_proba(self, X):
        """``log(predict_proba(X))``."""
        y_prob = self.predict_proba(X)
        return np.log(y_prob, out=y_prob)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True
        return tags


class MLPRegressor(RegressorMixin, _BaseMLP):
    """Multi-layer perceptron regressor trained with Adam by numbagrad.

    Squared error with an identity output, or the Poisson deviance with an
    exponential output (``loss="poisson"``), as scikit-learn's ``MLPRegressor``.
    """

    __doc__ += _COMMON_DOC

    _loss_options = ("squared_error", "poisson")

    def __init__(self, loss="squared_error", hidden_layer_sizes=(100,), activation="relu", *,
                 solver="adam", alpha=0.0001, batch_size="auto", learning_rate_init=0.001,
                 max_iter=200, shuffle=True, random_state=None, tol=1e-4, verbose=False,
                 warm_start=False, early_stopping=False, validation_fraction=0.1, beta_1=0.9,
                 beta_2=0.999, epsilon=1e-8, n_iter_no_change=10, accumulate_steps=1,
                 dtype=None, device="cpu"):
        self.loss = loss
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate_init = learning_rate_init
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.warm_start = warm_start
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.n_iter_no_change = n_iter_no_change
        self.accumulate_steps = accumulate_steps
        self.dtype = dtype
        self.device = device

    def fit(self, X, y):
        """Fit the model to ``X`` (n_samples, n_features) and targets ``y``."""
        return self._fit(X, y, incremental=False)

    def partial_fit(self, X, y):
        """One epoch over ``X, y``."""
        return self._fit(X, y, incremental=True)

    def _validate_input(self, X, y, incremental, reset):
        X, y = validate_data(self, X, y, accept_sparse=["csr", "csc"], multi_output=True,
                             y_numeric=True, dtype=(np.float64, np.float32), reset=reset)
        if y.ndim == 2 and y.shape[1] == 1:
            y = column_or_1d(y, warn=True)
        if self.loss == "poisson" and np.any(y < 0):
            raise ValueError("loss='poisson' needs non-negative targets y")
        return X, y

    def _out_activation(self) -> str:
        return "exp" if self.loss == "poisson" else "identity"

    def _targets(self, Y: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return np.ascontiguousarray(Y, dtype=dtype)

    def _report_scale(self) -> float:
        # scikit-learn reports the squared loss averaged over the outputs but
        # back-propagates it summed over them.
        return 1.0 / self.n_outputs_ if self.loss == "squared_error" else 1.0

    def _loss_offset(self, Y: np.ndarray) -> float:
        if self.loss != "poisson":
            return 0.0
        # the reported deviance holds xlogy(y, y) - y, which has no gradient
        return float((xlogy(Y, Y) - Y).sum() / max(len(Y), 1))

    def _tape_loss(self, out, target, scale, whole_batch):
        target = as_tensor(target)
        if self.loss == "poisson":
            return ops.sum(ops.exp(out) - out * target) * scale
        return ops.mse_loss(out, target, reduction="sum") * (0.5 * scale)

    def predict(self, X):
        """Predicted targets, shape (n_samples,) or (n_samples, n_outputs)."""
        check_is_fitted(self)
        return self._predict(X)

    def _predict(self, X, check_input=True, coefs=None, intercepts=None):
        y_pred = self._forward_pass_fast(X, check_input, coefs, intercepts)
        return y_pred.ravel() if y_pred.shape[1] == 1 else y_pred

    def _score_with(self, X, y, coefs, intercepts) -> float:
        y_pred = self._predict(X, False, coefs, intercepts)
        if not np.isfinite(y_pred).all():
            return np.nan
        from sklearn.metrics import r2_score
        return r2_score(y, y_pred)
