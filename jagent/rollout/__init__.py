"""jagent.rollout: multi-turn agent rollouts (text layer, reply parser, one-program rollout).

Please don't use symbols in the ``_``-prefixed modules: they may change.
"""

__all__ = ()
