"""Optimizers that own gradient accumulation: SGD, Adam and AdamW.

An optimizer is two parts kept apart, as optax keeps ``MultiSteps`` apart
from the transformations it wraps:

- the **window** (``window.py``): ``accumulate_steps`` micro-steps per
  update, the ``.grad`` and ``step(grads)`` spellings, ``average`` (1/k, the
  sum, or 1/samples), ``flush()``, the non-finite check, gradient clipping
  and the hook ``numbagrad.distributed`` plugs in; a small CPU group's
  window closes in one call of the rule's boundary kernel (``Boundary``),
  the one ``ng.compile`` runs inside its compiled step;
- the **update rule** (``rules.py``): SGD, Adam or AdamW, their per-element
  state and one fused kernel each.

The params are packed into flat buffers per (device, dtype) group
(``groups.py``), so one kernel call updates a group. ``lr`` is a float or a
callable of ``t`` (``schedules.py`` has built-ins that state dicts save).
"""
from . import schedules
from .optimizer import SGD, Adam, AdamW, Optimizer

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "schedules"]
