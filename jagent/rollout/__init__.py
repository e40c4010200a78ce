"""jagent.rollout: multi-turn agent rollouts (text layer, reply parser, one-program rollout).

Please don't use symbols in the ``_``-prefixed modules: they may change.
"""

from jagent.rollout._parse import parse_reply
from jagent.rollout._parse import parse_tokens
from jagent.rollout._parse import ParsedReply
from jagent.rollout._parse import ParseSpec
from jagent.rollout._parse import reference_parse

__all__ = (
    "ParseSpec",
    "ParsedReply",
    "parse_reply",
    "parse_tokens",
    "reference_parse",
)
