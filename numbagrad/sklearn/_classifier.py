"""``MLPClassifier``: log-loss, softmax or logistic outputs, labels in and out."""
from __future__ import annotations

import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.preprocessing import LabelBinarizer
from sklearn.utils import column_or_1d
from sklearn.utils.multiclass import check_classification_targets, type_of_target, unique_labels
from sklearn.utils.validation import check_is_fitted, validate_data

from .. import ops
from ..tensor import as_tensor
from ._base import _BaseMLP
from ._params import PARAMS_DOC, with_params


@with_params()
class MLPClassifier(ClassifierMixin, _BaseMLP):
    """Multi-layer perceptron classifier trained with Adam by numbagrad.

    Log-loss with a softmax output for multiclass targets, a logistic output
    for binary and multilabel ones (as scikit-learn's ``MLPClassifier``).
    """

    __doc__ += PARAMS_DOC + "    classes_ : ndarray of the class labels.\n"

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
