r"""Regenerates the Hugging Face parity fixtures under tests/fixtures/.

    pip install -c constraints.txt -e '.[hf]'   # torch 2.13.0 + transformers 5.25.0 (fixtures only)
    python -m experiments.make_hf_fixtures [--out=tests/fixtures]

Builds two tiny random checkpoints with ``transformers`` and saves each with
``save_pretrained`` plus reference outputs computed by ``transformers`` in
float32 (eager attention):

- ``hf_qwen2_tiny/``: Qwen2ForCausalLM, q/k/v biases, GQA 4:2, untied
  embeddings, one model.safetensors.
  RMSNorm scales are perturbed from 1 and biases drawn from N(0, 0.2^2), so
  every tensor's layout is exercised.
- ``hf_llama_tiny/``: LlamaForCausalLM, GQA 4:1, tied embeddings, "llama3"
  RoPE scaling with a small original context (so scaling matters at the tested
  positions), saved sharded (model.safetensors.index.json).

``reference.npz`` in each holds ``input_ids`` int32 [2, 24], ``logits``
float32 [2, 24, V], ``prompt`` int32 [2, 8], ``greedy`` int32 [2, 32] (greedy
continuation, EOS disabled) and ``greedy_margin`` (the smallest top-1 minus
top-2 logit gap along the greedy path: a near tie would make the comparison
fragile, so seeds are chosen with a clear margin).

``hf_tokenizer/`` holds a small byte-level BPE ``tokenizer.json`` (trained by
the ``tokenizers`` library on the tiny tokenizer's corpus, ChatML special
tokens) and a ``tokenizer_config.json`` with a ChatML Jinja chat template, and
``reference.json`` with ``transformers.AutoTokenizer``'s encodings and chat
prompt for a few texts.

The tests read these files only; they never need torch or transformers.
"""

from __future__ import annotations

import json
import os

from absl import app
from absl import flags
import numpy as np

_OUT = flags.DEFINE_string("out", "tests/fixtures", "Fixture root directory.")

VOCAB = 384
PROMPT, CONT, SEQ = 8, 32, 24


def _models():
  import transformers  # pylint: disable=g-import-not-at-top
  common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=256, initializer_range=0.15, bos_token_id=1,
                eos_token_id=2, pad_token_id=0, attn_implementation="eager")
  qwen = transformers.Qwen2Config(
      **common, num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=False,
      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-6)
  llama = transformers.LlamaConfig(
      **common, num_key_value_heads=1, intermediate_size=96, head_dim=16,
      tie_word_embeddings=True, attention_bias=False, mlp_bias=False, rms_norm_eps=1e-5,
      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 32})
  return {
      "hf_qwen2_tiny": (transformers.Qwen2ForCausalLM, qwen, None),
      "hf_llama_tiny": (transformers.LlamaForCausalLM, llama, "60KB"),
  }


def _reference(model, seed):
  import torch  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  input_ids = rng.integers(3, VOCAB, size=(2, SEQ)).astype(np.int64)
  prompt = rng.integers(3, VOCAB, size=(2, PROMPT)).astype(np.int64)
  with torch.no_grad():
    logits = model(torch.from_numpy(input_ids)).logits.float().numpy()
    out = model.generate(torch.from_numpy(prompt), attention_mask=torch.ones_like(
        torch.from_numpy(prompt)), do_sample=False, max_new_tokens=CONT, min_new_tokens=CONT,
                         eos_token_id=None, pad_token_id=0)
    seq = out.numpy()
    full = model(torch.from_numpy(seq)).logits.float().numpy()
  steps = full[:, PROMPT - 1:-1]
  top2 = np.sort(steps, axis=-1)[..., -2:]
  margin = float((top2[..., 1] - top2[..., 0]).min())
  return dict(input_ids=input_ids.astype(np.int32), logits=logits.astype(np.float32),
              prompt=prompt.astype(np.int32), greedy=seq[:, PROMPT:].astype(np.int32),
              greedy_margin=np.float32(margin))


CHATML_JINJA = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TOKENIZER_TEXTS = ("Turn 1:\nState:\n#__P#\n#_XO#", " leading  spaces\n\n and √ unicode ü€",
                   "<|im_start|>user\nmove Up<|im_end|>", "Target: 24, nums: [3, 5, 7]")


def _tokenizer(out):
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from experiments import make_tiny_tokenizer  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=600, special_tokens=specials,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(make_tiny_tokenizer.corpus(n=3000), trainer=trainer)
  os.makedirs(out, exist_ok=True)
  tok.save(os.path.join(out, "tokenizer.json"))
  cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
         "pad_token": "<|endoftext|>", "bos_token": None, "chat_template": CHATML_JINJA,
         "model_max_length": 4096}
  with open(os.path.join(out, "tokenizer_config.json"), "w") as fh:
    json.dump(cfg, fh, indent=2)
  hf = transformers.AutoTokenizer.from_pretrained(out)
  msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go."}]
  ref = {"texts": list(TOKENIZER_TEXTS),
         "ids": [hf.encode(t, add_special_tokens=False) for t in TOKENIZER_TEXTS],
         "messages": msgs,
         "chat": hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
         "eos_id": hf.eos_token_id, "pad_id": hf.pad_token_id, "vocab_size": len(hf)}
  with open(os.path.join(out, "reference.json"), "w") as fh:
    json.dump(ref, fh, indent=1)
  print("hf_tokenizer", ref["vocab_size"], "tokens")


def main(argv):
  del argv
  import torch  # pylint: disable=g-import-not-at-top
  _tokenizer(os.path.join(_OUT.value, "hf_tokenizer"))
  for name, (cls, cfg, shard) in _models().items():
    for seed in range(20):
      torch.manual_seed(seed)
      model = cls(cfg).eval().float()
      with torch.no_grad():  # HF inits norms to 1 and biases to 0: perturb them too.
        for pname, param in model.named_parameters():
          if pname.endswith("norm.weight"):
            param.add_(0.2 * torch.randn_like(param))
          elif pname.endswith(".bias"):
            param.normal_(0.0, 0.2)
      ref = _reference(model, seed)
      if ref["greedy_margin"] > 1e-3:
        break
    out = os.path.join(_OUT.value, name)
    os.makedirs(out, exist_ok=True)
    for fn in os.listdir(out):
      os.remove(os.path.join(out, fn))
    kw = {} if shard is None else {"max_shard_size": shard}
    model.save_pretrained(out, **kw)
    np.savez(os.path.join(out, "reference.npz"), **ref)
    os.remove(os.path.join(out, "generation_config.json"))  # unused by our loader
    with open(os.path.join(out, "config.json")) as fh:
      saved = json.load(fh)
    print(name, "seed", seed, "files", sorted(os.listdir(out)), "margin",
          float(ref["greedy_margin"]), "dtype", saved.get("dtype"))


if __name__ == "__main__":
  app.run(main)
