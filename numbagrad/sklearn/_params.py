"""The estimators' constructor parameters: one list, its checks and its docs.

scikit-learn reads an estimator's parameters from the signature of its
``__init__`` (``get_params``, ``clone``, ``repr``), so they must appear there
by name, not as ``**kwargs``. ``PARAMS`` is the list both estimators share, in
scikit-learn's order; ``with_params`` gives a class an ``__init__`` whose
signature is ``PARAMS`` (after the class's own leading parameters, such as
``MLPRegressor``'s ``loss``) and which stores every argument unchanged, as
scikit-learn requires; ``check_params`` validates them at ``fit``.
"""
from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

# (name, default), in scikit-learn's order; the first POSITIONAL may be passed
# by position (after the leading ones), the rest by keyword only, as there.
PARAMS: tuple[tuple[str, Any], ...] = (
    ("hidden_layer_sizes", (100,)),
    ("activation", "relu"),
    ("solver", "adam"),
    ("alpha", 0.0001),
    ("batch_size", "auto"),
    ("learning_rate_init", 0.001),
    ("max_iter", 200),
    ("shuffle", True),
    ("random_state", None),
    ("tol", 1e-4),
    ("verbose", False),
    ("warm_start", False),
    ("early_stopping", False),
    ("validation_fraction", 0.1),
    ("beta_1", 0.9),
    ("beta_2", 0.999),
    ("epsilon", 1e-8),
    ("n_iter_no_change", 10),
    ("accumulate_steps", 1),
    ("dtype", None),
    ("device", "cpu"),
)
POSITIONAL = 2

PARAMS_DOC = """
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


def with_params(*leading: tuple[str, Any]) -> Callable[[type], type]:
    """Class decorator: an ``__init__(self, *leading, *PARAMS)`` that stores
    each argument as an attribute of the same name and does nothing else."""
    names = [name for name, _ in (*leading, *PARAMS)]
    kinds = ([inspect.Parameter.POSITIONAL_OR_KEYWORD] * (len(leading) + POSITIONAL)
             + [inspect.Parameter.KEYWORD_ONLY] * (len(PARAMS) - POSITIONAL))
    signature = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(name, kind, default=default)
           for (name, default), kind in zip((*leading, *PARAMS), kinds)])

    def decorate(cls: type) -> type:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{type(self).__name__}(): {exc}") from None
            bound.apply_defaults()
            for name in names:
                setattr(self, name, bound.arguments[name])

        __init__.__signature__ = signature     # what inspect, and so scikit-learn, reads
        __init__.__qualname__ = f"{cls.__qualname__}.__init__"
        __init__.__doc__ = f"Store the parameters ({', '.join(names)}); see the class."
        cls.__init__ = __init__
        return cls
    return decorate


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def _bad(name: str, rule: str, value: Any) -> ValueError:
    return ValueError(f"The {name!r} parameter must be {rule}. Got {value!r} instead.")


ACTIVATIONS = ("identity", "logistic", "tanh", "relu")
FLOATS = (np.dtype(np.float64), np.dtype(np.float32))


def check_params(est: Any, loss_options: tuple[str, ...] = ()) -> list[int]:
    """Validate ``est``'s constructor parameters (at fit, as scikit-learn
    does; ``loss`` too when ``loss_options``); return the hidden layer sizes
    as a list."""
    sizes = est.hidden_layer_sizes
    sizes = list(sizes) if hasattr(sizes, "__iter__") else [sizes]
    if not all(_is_int(s) for s in sizes):
        raise _bad("hidden_layer_sizes", "an int or a sequence of ints", est.hidden_layer_sizes)
    if any(s <= 0 for s in sizes):
        raise ValueError(f"hidden_layer_sizes must be > 0, got {sizes}.")
    checks = [
        ("activation", est.activation in ACTIVATIONS, f"one of {ACTIVATIONS}"),
        ("solver", est.solver == "adam", "'adam' (numbagrad's MLPs train with Adam only)"),
        ("alpha", _is_real(est.alpha) and est.alpha >= 0, "a real number >= 0"),
        ("batch_size", est.batch_size == "auto" if isinstance(est.batch_size, str)
         else _is_int(est.batch_size) and est.batch_size >= 1, "'auto' or an int >= 1"),
        ("learning_rate_init", _is_real(est.learning_rate_init)
         and est.learning_rate_init > 0, "a real number > 0"),
        ("max_iter", _is_int(est.max_iter) and est.max_iter >= 1, "an int >= 1"),
        ("shuffle", _is_bool(est.shuffle), "a bool"),
        ("tol", _is_real(est.tol) and est.tol >= 0, "a real number >= 0"),
        ("verbose", _is_bool(est.verbose) or _is_int(est.verbose), "a bool or an int"),
        ("warm_start", _is_bool(est.warm_start), "a bool"),
        ("early_stopping", _is_bool(est.early_stopping), "a bool"),
        ("validation_fraction", _is_real(est.validation_fraction)
         and 0 <= est.validation_fraction < 1, "a real number in [0, 1)"),
        ("beta_1", _is_real(est.beta_1) and 0 <= est.beta_1 < 1, "a real number in [0, 1)"),
        ("beta_2", _is_real(est.beta_2) and 0 <= est.beta_2 < 1, "a real number in [0, 1)"),
        ("epsilon", _is_real(est.epsilon) and est.epsilon > 0, "a real number > 0"),
        ("n_iter_no_change", (_is_int(est.n_iter_no_change) and est.n_iter_no_change >= 1)
         or est.n_iter_no_change == np.inf, "an int >= 1 or numpy.inf"),
        ("accumulate_steps", _is_int(est.accumulate_steps) and est.accumulate_steps >= 1,
         "an int >= 1"),
        ("device", est.device in ("cpu", "cuda"), "'cpu' or 'cuda'"),
    ]
    if loss_options:
        checks.append(("loss", est.loss in loss_options, f"one of {loss_options}"))
    for name, ok, rule in checks:
        if not ok:
            raise _bad(name, rule, getattr(est, name))
    if est.dtype is not None:
        try:
            ok = np.dtype(est.dtype) in FLOATS
        except TypeError:
            ok = False
        if not ok:
            raise _bad("dtype", "None, 'float32' or 'float64'", est.dtype)
    return sizes
