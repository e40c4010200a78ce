"""jagent.train: train state, jit-compiled train steps, checkpoints and metrics.

Please don't use symbols in the ``_``-prefixed modules: they may change.
"""

__all__ = ()
