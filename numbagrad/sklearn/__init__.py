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

The package: ``_params`` (the constructor parameters both estimators
share, their checks and docs), ``_base`` (the training loop),
``_classifier`` and ``_regressor`` (the per-task parts).

Needs scikit-learn >= 1.6 (``pip install numbagrad[sklearn]``); ``verbose``
shows a tqdm progress bar when tqdm is installed and plain per-epoch lines
otherwise.
"""
from ._classifier import MLPClassifier
from ._regressor import MLPRegressor

__all__ = ["MLPClassifier", "MLPRegressor"]
