"""``MLPRegressor``: squared error (identity output) or Poisson deviance (exp output)."""
from __future__ import annotations

import numpy as np
from scipy.special import xlogy
from sklearn.base import RegressorMixin
from sklearn.utils import column_or_1d
from sklearn.utils.validation import check_is_fitted, validate_data

from .. import ops
from ..tensor import as_tensor
from ._base import _BaseMLP
from ._params import PARAMS_DOC, with_params


@with_params(("loss", "squared_error"))
class MLPRegressor(RegressorMixin, _BaseMLP):
    """Multi-layer perceptron regressor trained with Adam by numbagrad.

    Squared error with an identity output, or the Poisson deviance with an
    exponential output (``loss="poisson"``), as scikit-learn's ``MLPRegressor``.
    """

    __doc__ += PARAMS_DOC

    _loss_options = ("squared_error", "poisson")

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
