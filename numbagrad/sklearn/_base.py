"""The training loop both estimators share (``_BaseMLP``) and its host maths."""
from __future__ import annotations

import contextlib
import itertools
import sys
import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.special import expit
from sklearn.base import BaseEstimator, is_classifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils.validation import validate_data
from threadpoolctl import ThreadpoolController

from .. import kernels, nn, ops, optim
from ..tape import grad_tape
from ..tensor import as_tensor, tensor
from ._params import check_params

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


def _add_l2(weights: list, c: float) -> float:
    """Add the L2 penalty's gradient ``c * W`` into each weight's gradient;
    returns ``sum(||W||^2)``. The same kernels on either device (no NumPy
    BLAS call, which would wake a second thread pool beside the kernels')."""
    kern = kernels.get(weights[0].device)
    sq = kernels.empty(kern, (len(weights),), np.float64)
    for i, w in enumerate(weights):
        kernels.call(kern, "sumsq", 0, w.data.ravel(), sq[i:i + 1])
        kernels.call(kern, "axpby", 0, c, w.data, 1.0, w.grad)
    return float(kernels.to_host(kern, sq).sum())


def _dense(X: Any) -> np.ndarray:
    return X.toarray() if sp.issparse(X) else X


class _BaseMLP(BaseEstimator):
    """Shared training loop; use MLPClassifier or MLPRegressor."""

    _loss_options: tuple[str, ...] = ()

    # ------------------------------------------------------------ fit
    def fit(self, X: Any, y: Any) -> _BaseMLP:
        """Fit the model to ``X`` (n_samples, n_features) and labels or targets ``y``."""
        return self._fit(X, y, incremental=False)

    def _fit(self, X: Any, y: Any, incremental: bool) -> _BaseMLP:
        hidden = check_params(self, self._loss_options)
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
            short = False
            for stop in cuts:
                if stop == start:      # fewer samples than micro-batches: flushed below
                    short = True
                    continue
                with grad_tape():
                    h = as_tensor(Xe[start:stop])
                    for i, (w, b) in enumerate(layers):
                        h = linear(h, w, b)
                        if i < last and act is not None:
                            h = act(h)
                    loss = loss_fn(h, Te[start:stop], scale, len(cuts) == 1)
                loss.backward()
                batch_loss += loss.item() * report_scale
                if l2:   # d/dW of 0.5 * alpha * ||W||^2 / n
                    l2 = False
                    sq = _add_l2(weights, alpha * scale)
                    batch_loss += 0.5 * alpha * sq * scale
                opt.step()
                start = stop
            if short:   # the window's micro-steps, fewer than accumulate_steps
                opt.flush()
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
