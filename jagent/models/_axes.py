"""Logical axis names of the model's arrays (one home, so sharding rules can refer to them).

The transformer's parameters and KV cache, and the LoRA adapters, name their
dimensions with these strings (``PartitionSpec`` leaves of
``jagent.models.param_axes`` / ``cache_axes`` / ``lora_axes``); a rule table
maps them to mesh axes, as ``flax.linen.logical_axis_rules`` does.
"""

VOCAB = "vocab"
EMBED = "embed"
Q_HEADS = "q_heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
MLP = "mlp"
BATCH = "batch"
CACHE_SEQ = "cache_seq"
LAYERS = "layers"
# The adapters' rank dimension (replicated by the default rules).
LORA_RANK = "lora_rank"
