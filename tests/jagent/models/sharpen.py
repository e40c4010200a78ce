"""Test weights far from init's near-uniform next-token distributions."""

import jax

from jagent import models


def sharpened(params: models.Params, factor: float) -> models.Params:
  """``params`` with every weight and bias times ``factor``; the RMSNorm scales stay as they are.

  Larger projections make the logits (and so the log-probs the tests compare)
  far from uniform, as a trained model's are, while the norms keep the
  residual stream's scale.
  """
  scaled = jax.tree.map(lambda x: x * factor, params)
  return scaled.replace(final_norm=params.final_norm, layers=scaled.layers.replace(
      attn_norm=params.layers.attn_norm, mlp_norm=params.layers.mlp_norm))
