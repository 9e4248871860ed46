"""A tiny random-weight BERT encoder in the sentence-transformers layout, built in-process.

The same layout as the embedded all-MiniLM-L6-v2 (a BERT encoder, WordPiece tokenizer,
`modules.json` listing Pooling (mean) and Normalize), at a size that loads in milliseconds:
for tests that need an embedding model in the server but not MiniLM's weights (the fuzz test).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.tiny_model import CORPUS


def build_tiny_bert(path: Path, *, seed: int = 0) -> Path:
    """Write the model, its tokenizer and its pooling recipe to `path` and return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    # At least 128 entries: the embedding runner warms up on ids 101 and 102 (BERT's CLS/SEP).
    trainer = trainers.WordPieceTrainer(vocab_size=256, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(CORPUS + [" ".join(chr(c) for c in range(33, 127))], trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
    fast.model_max_length = 64
    fast.save_pretrained(path)
    vocab = max(len(fast), 128)

    config = BertConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=fast.pad_token_id,
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(path)

    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    return path
