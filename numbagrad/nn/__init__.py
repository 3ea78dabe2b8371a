"""Layers in PyTorch's ``nn.Module`` style; initialisers in ``nn.init``.

The namespace holds ``Module``, the layers, the containers and ``init``
(``__all__``), and the modules they live in:

- ``module.py``: ``Module`` and the change tracking ``ng.compile`` reads;
- ``layers.py``: ``Linear``, ``Identity``, ``Flatten``, ``Dropout``, ``Embedding``;
- ``activation.py``: ``ReLU``, ``LeakyReLU``, ``Tanh``, ``Sigmoid``, ``GELU``,
  ``SiLU``, ``Softplus``, ``ELU``, ``SELU``, ``CELU``, ``Hardtanh``, ``ReLU6``,
  ``Hardsigmoid``, ``Hardswish``, ``Mish``, ``Softsign``, ``LogSigmoid``, ``QuickGELU``;
- ``containers.py``: ``Sequential``, ``ModuleList``, ``ModuleDict``;
- ``loss.py``: the loss modules (``MSELoss``, ``CrossEntropyLoss``, ...);
- ``fusion.py``: which ``Linear`` + activation pairs ``Sequential`` runs as one op;
- ``conv.py`` (convolutions, pooling, ``Upsample``), ``norm.py``, ``attention.py``,
  ``rnn.py`` (``RNN``, ``LSTM``, ``GRU``): the layer families;
- ``init.py``: ``torch.nn.init``'s initialisers;
- ``functional.py``: the ops under ``torch.nn.functional``'s names (``F.relu``);
- ``utils.py``: ``clip_grad_norm_``, ``clip_grad_value_``;
- ``checkpoint.py``: ``Checkpoint``, a module run through ``ng.checkpoint``.
"""
from . import functional, init, utils
from .activation import (CELU, ELU, GELU, SELU, Hardsigmoid, Hardswish, Hardtanh, LeakyReLU,
                         LogSigmoid, Mish, QuickGELU, ReLU, ReLU6, Sigmoid, SiLU, Softplus,
                         Softsign, Tanh)
from .attention import MultiheadAttention
from .containers import ModuleDict, ModuleList, Sequential
from .conv import (AdaptiveAvgPool2d, AvgPool2d, Conv1d, Conv2d, Conv3d, ConvTranspose1d,
                   ConvTranspose2d, MaxPool2d, MaxUnpool2d, Upsample)
from .layers import Dropout, Embedding, Flatten, Identity, Linear
from .loss import (BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, L1Loss, MSELoss,
                   NLLLoss, SmoothL1Loss)
from .module import Module
from .norm import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from .rnn import GRU, LSTM, RNN
from .checkpoint import Checkpoint

__all__ = ["Module", "Linear", "Sequential", "ReLU", "LeakyReLU", "Tanh", "Sigmoid", "GELU",
           "SiLU", "Softplus", "Identity", "Flatten", "Dropout", "Embedding", "ModuleList",
           "ModuleDict", "init", "Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d",
           "AdaptiveAvgPool2d", "LayerNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d",
           "MultiheadAttention", "functional", "utils", "ELU", "SELU", "CELU", "Hardtanh",
           "ReLU6", "Hardsigmoid", "Hardswish", "Mish", "Softsign", "LogSigmoid", "QuickGELU",
           "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss",
           "CrossEntropyLoss", "NLLLoss", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "MaxUnpool2d", "Upsample", "RNN", "LSTM", "GRU", "Checkpoint"]
