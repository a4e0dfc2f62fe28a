"""The training tokenizer as a transformers tokenizer, for Hugging Face exports.

`to_transformers(tokenizer)` returns a `PreTrainedTokenizerFast` that encodes text to the same
ids as training did and names the special tokens, so `save_pretrained` writes tokenizer.json
and a tokenizer_config.json with them, and the exported config.json / generation_config.json
can take their ids from it:

- EOS is the token the preparer appended after every document (`Tokenizer.eos_id`): generation
  stops on it.
- A Hugging Face tokenizer directory (tokenizer_config.json) keeps its own special tokens and
  settings (chat template, BOS, pad); only EOS is set to the training EOS if it differs.
- A bare tokenizer.json (the builtin BPE included) gets BOS and pad from the usual names when
  the vocabulary has them, else the EOS token: in a packed stream a document starts right after
  an EOS, so EOS is also the natural start-of-document context (GPT-2's convention).

Literal special-token text inside documents was encoded as ordinary text in training
(`encode_special_tokens`); the exported tokenizer matches special tokens as transformers
normally does, which only differs for text that spells a special token.
"""

from __future__ import annotations

import logging
from pathlib import Path

import tokenizers

from data.errors import DataError
from data.tokenizer import Tokenizer

log = logging.getLogger(__name__)

BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>")
"""BOS tokens looked for in a bare tokenizer.json (first present wins)."""
PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]")
"""Pad tokens looked for in a bare tokenizer.json (first present wins)."""


def to_transformers(tokenizer: Tokenizer):
    """A `transformers.PreTrainedTokenizerFast` equivalent to `tokenizer` for export (see the module doc)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    eos_token = tokenizer.backend.id_to_token(tokenizer.eos_id)
    source = Path(tokenizer.path) if tokenizer.path else None
    if source is not None and source.is_dir() and (source / "tokenizer_config.json").is_file():
        try:
            hf = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
        except Exception as error:  # noqa: BLE001 - transformers raises many types
            raise DataError(f"cannot load the tokenizer directory {source} with transformers: {error}") from error
        if hf.eos_token != eos_token:
            log.warning("tokenizer %s: its tokenizer_config.json names EOS %r, training appended %r; the export "
                        "uses %r so that generation stops where documents ended", source, hf.eos_token, eos_token,
                        eos_token)
            hf.eos_token = eos_token
        return hf
    # A fresh backend: the training wrapper switched special-token matching off at run time.
    backend = tokenizers.Tokenizer.from_str(tokenizer.backend.to_str())
    vocabulary = backend.get_vocab(with_added_tokens=True)
    bos_token = next((name for name in BOS_NAMES if name in vocabulary), eos_token)
    pad_token = next((name for name in PAD_NAMES if name in vocabulary), eos_token)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eos_token, bos_token=bos_token,
                                   pad_token=pad_token, name_or_path=tokenizer.name)
