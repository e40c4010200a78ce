"""jagent.rollout: multi-turn agent rollouts (text layer, reply parser, one-program rollout).

Please don't use symbols in the ``_``-prefixed modules: they may change.
"""

from jagent.rollout._experts import demonstrations
from jagent.rollout._experts import EXPERT_POLICIES
from jagent.rollout._experts import make_expert
from jagent.rollout._host import Expert
from jagent.rollout._host import expert_rollout
from jagent.rollout._host import host_rollout
from jagent.rollout._host import HostEnv
from jagent.rollout._host import HostStep
from jagent.rollout._host import JaxEnvAsHost
from jagent.rollout._parse import parse_reply
from jagent.rollout._parse import parse_tokens
from jagent.rollout._parse import ParsedReply
from jagent.rollout._parse import ParseSpec
from jagent.rollout._parse import reference_parse
from jagent.rollout._rollout import context_size
from jagent.rollout._rollout import first_reply_prompt_tokens
from jagent.rollout._rollout import group_reset_keys
from jagent.rollout._rollout import make_rollout
from jagent.rollout._rollout import RolloutConfig
from jagent.rollout._text import Conversation
from jagent.rollout._text import default_instructions
from jagent.rollout._text import format_reward
from jagent.rollout._text import PromptConfig
from jagent.rollout._text import TextEnv
from jagent.rollout._tree import TreeConfig
from jagent.rollout._trajectory import END_REASONS
from jagent.rollout._trajectory import Trajectory

__all__ = (
    "END_REASONS",
    "EXPERT_POLICIES",
    "Conversation",
    "Expert",
    "HostEnv",
    "HostStep",
    "JaxEnvAsHost",
    "PromptConfig",
    "RolloutConfig",
    "TextEnv",
    "Trajectory",
    "TreeConfig",
    "context_size",
    "first_reply_prompt_tokens",
    "default_instructions",
    "demonstrations",
    "expert_rollout",
    "format_reward",
    "group_reset_keys",
    "host_rollout",
    "make_expert",
    "make_rollout",
    "ParseSpec",
    "ParsedReply",
    "parse_reply",
    "parse_tokens",
    "reference_parse",
)
