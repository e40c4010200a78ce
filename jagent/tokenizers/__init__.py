"""jagent.tokenizers: one interface over sentencepiece and Hugging Face tokenizers.

Please don't use symbols in the ``_``-prefixed modules: they may change.
"""

from jagent.tokenizers._base import CHAT_TEMPLATES
from jagent.tokenizers._base import CHAT_TEMPLATES_JINJA
from jagent.tokenizers._base import chatml_template
from jagent.tokenizers._base import gather_bytes
from jagent.tokenizers._base import llama3_template
from jagent.tokenizers._base import plain_template
from jagent.tokenizers._base import Tokenizer
from jagent.tokenizers._hf import HFTokenizer
from jagent.tokenizers._sentencepiece import load_tiny_tokenizer
from jagent.tokenizers._sentencepiece import SentencePieceTokenizer
from jagent.tokenizers._sentencepiece import tiny_tokenizer_path
from jagent.tokenizers._sentencepiece import TINY_SYMBOLS
from jagent.tokenizers._sentencepiece import TINY_TAGS
from jagent.tokenizers._sentencepiece import train_sentencepiece

__all__ = (
    "CHAT_TEMPLATES",
    "CHAT_TEMPLATES_JINJA",
    "HFTokenizer",
    "SentencePieceTokenizer",
    "TINY_SYMBOLS",
    "TINY_TAGS",
    "Tokenizer",
    "chatml_template",
    "gather_bytes",
    "llama3_template",
    "plain_template",
    "load_tiny_tokenizer",
    "tiny_tokenizer_path",
    "train_sentencepiece",
)
