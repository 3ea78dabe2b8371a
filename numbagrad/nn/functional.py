"""``torch.nn.functional``'s spelling of numbagrad's ops: ``import numbagrad.nn.functional as F``.

Each name is the op itself (``F.relu is ng.relu``), exported for every row of
the op table (``ops/table.py``) whose name ``torch.nn.functional`` also has
(``_TORCH_NAMES``), so a new row under such a name shows up here with no
edit. The ops take PyTorch's keywords where their names differ from NumPy's
(``F.softmax(x, dim=1)``). A name in ``_DIFFERENT`` is left out because the
op of that name means something else than PyTorch's function; asking for it
says so.
"""
from __future__ import annotations

from typing import Any

from ..ops.table import BY_NAME, OPS

# torch.nn.functional's public functions (PyTorch 2.13), without the in-place
# "_" variants and the torch-function plumbing.
_TORCH_NAMES = frozenset("""
adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d
adaptive_max_pool1d_with_indices adaptive_max_pool2d adaptive_max_pool2d_with_indices
adaptive_max_pool3d adaptive_max_pool3d_with_indices affine_grid alpha_dropout avg_pool1d
avg_pool2d avg_pool3d batch_norm bilinear binary_cross_entropy binary_cross_entropy_with_logits
celu channel_shuffle conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d
conv_transpose3d cosine_embedding_loss cosine_similarity cross_entropy ctc_loss dropout
dropout1d dropout2d dropout3d elu embedding embedding_bag feature_alpha_dropout fold
fractional_max_pool2d fractional_max_pool2d_with_indices fractional_max_pool3d
fractional_max_pool3d_with_indices gaussian_nll_loss gelu glu grid_sample group_norm
grouped_mm gumbel_softmax hardshrink hardsigmoid hardswish hardtanh hinge_embedding_loss
huber_loss instance_norm interpolate kl_div l1_loss layer_norm leaky_relu linear
linear_cross_entropy local_response_norm log_softmax logsigmoid lp_pool1d lp_pool2d lp_pool3d
margin_ranking_loss max_pool1d max_pool1d_with_indices max_pool2d max_pool2d_with_indices
max_pool3d max_pool3d_with_indices max_unpool1d max_unpool2d max_unpool3d mish mse_loss
multi_head_attention_forward multi_margin_loss multilabel_margin_loss
multilabel_soft_margin_loss native_channel_shuffle nll_loss normalize one_hot pad
pairwise_distance pdist pixel_shuffle pixel_unshuffle poisson_nll_loss prelu relu relu6
rms_norm rrelu scaled_dot_product_attention scaled_grouped_mm scaled_mm selu sigmoid silu
smooth_l1_loss soft_margin_loss softmax softmin softplus softshrink softsign tanh tanhshrink
threshold triplet_margin_loss triplet_margin_with_distance_loss unfold upsample
upsample_bilinear upsample_nearest
""".split())

# op name -> why the op is not PyTorch's function of that name
_DIFFERENT = {
    "pad": "ng.pad takes NumPy's pad_width (one (before, after) pair per dim, first dim "
           "first), F.pad a flat tuple starting from the last dim; the same call would pad "
           "other dims, so use ng.pad with NumPy's form",
    "unfold": "ng.unfold is Tensor.unfold (windows of one dim, x.unfold(dim, size, step)), "
              "F.unfold extracts an image's sliding blocks (im2col), which numbagrad does not "
              "have",
}

__all__ = [op.name for op in OPS if op.name in _TORCH_NAMES and op.name not in _DIFFERENT]
globals().update({name: BY_NAME[name].fn for name in __all__})


def __getattr__(name: str) -> Any:
    if name in _DIFFERENT:
        raise AttributeError(f"numbagrad.nn.functional has no {name!r}: {_DIFFERENT[name]}")
    raise AttributeError(f"module 'numbagrad.nn.functional' has no attribute {name!r}")
