"""Tokenizer files as published checkpoints ship them, trained in the test (no download; each well under a second).

- `write_ernie_tokenizer`: ERNIE-4.5's files: a sentencepiece BPE `tokenizer.model` with byte fallback, `<pad>` 0,
  `<s>` 1, `</s>` 2, `<unk>` 3 and ERNIE's special tokens, plus `tokenizer_config.json` naming `Ernie4_5Tokenizer`
  with `add_bos_token` false and a template rendering ERNIE's chat format (as transformers' Ernie4_5Tokenizer does).
- `write_hf_tokenizer`: an HF family's files: a `tokenizers` byte-level BPE `tokenizer.json` with Qwen2's
  normalizer (NFC) and pre-tokenizer split and ChatML's special tokens, and `tokenizer_config.json` with a ChatML
  template (Qwen's shape); `bos=True` gives a Llama-3-like
  tokenizer whose post-processor adds BOS and whose template starts with `{{ bos_token }}`.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

# Words of several scripts, so that the vocabularies hold multi-byte pieces, and byte fallback is still needed for
# characters the corpus lacks.
_WORDS = ("the quick brown fox jumps over a lazy dog hello world serving model token stream prefill decode "
          "你好 你是谁 我是 人工智能 助手 百度 文心一言 模型 中文 日本語 テスト 한국어 café naïve résumé Ω π "
          "🎉 🚀 👍🏽 e\u0301 a\u0308 n\u0303").split()

ERNIE_SPECIALS = ("<|begin_of_sentence|>", "<|end_of_sentence|>", "<|IMAGE_PLACEHOLDER|>", "<mask:0>", "<mask:1>")
# ERNIE-4.5's chat format (cls_token first; "User: ...\n"; assistant turns end with sep_token; a system message is
# its content and a newline; the generation prompt is "Assistant: "), written for this fixture.
ERNIE_TEMPLATE = (
    "{%- if cls_token is not defined %}{% set cls_token = '<|begin_of_sentence|>' %}{% endif -%}\n"
    "{%- if sep_token is not defined %}{% set sep_token = '<|end_of_sentence|>' %}{% endif -%}\n"
    "{{- cls_token -}}\n"
    "{%- for message in messages -%}\n"
    "{%- if message['role'] == 'system' -%}{{- message['content'] + '\\n' -}}\n"
    "{%- elif message['role'] == 'user' -%}{{- 'User: ' + message['content'] + '\\n' -}}\n"
    "{%- elif message['role'] == 'assistant' -%}{{- 'Assistant: ' + message['content'] + sep_token -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- 'Assistant: ' -}}{%- endif -%}"
)
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA_STYLE_TEMPLATE = "{{- bos_token }}" + CHATML_TEMPLATE
# The pre-tokenizer split of Qwen2's tokenizer.json (contractions, letters with one leading non-letter, single
# digits, punctuation runs, newlines, spaces), which transformers' Qwen2Tokenizer also builds in.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def corpus(lines: int = 400) -> list[str]:
    """Deterministic sentences over _WORDS."""
    out = []
    for i in range(lines):
        words = [_WORDS[(i * 7 + k * 13) % len(_WORDS)] for k in range(3 + i % 9)]
        out.append(" ".join(words) + (".", "?", "!", "，", "。")[i % 5])
    return out


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")


def write_ernie_tokenizer(directory, vocab_size: int = 600, add_dummy_prefix: bool = False,
                          chat_template: str | None = ERNIE_TEMPLATE) -> int:
    """`tokenizer.model` + `tokenizer_config.json` in `directory`; returns the vocabulary size: `vocab_size`
    from 340 (the corpus' characters, 256 byte pieces and the specials) up to 652 (all the corpus' merges)."""
    import sentencepiece

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for coverage in (0.9995, 0.99, 0.98):   # a small vocabulary cannot hold every character: byte fallback then
        model = io.BytesIO()
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(corpus()), model_writer=model, vocab_size=vocab_size, model_type="bpe",
                byte_fallback=True, character_coverage=coverage, hard_vocab_limit=False, minloglevel=2,
                pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="<pad>", bos_piece="<s>", eos_piece="</s>",
                unk_piece="<unk>", user_defined_symbols=list(ERNIE_SPECIALS), normalization_rule_name="identity",
                add_dummy_prefix=add_dummy_prefix, remove_extra_whitespaces=False)
            break
        except RuntimeError as error:
            if "required_chars" not in str(error) or coverage == 0.98:
                raise
    (directory / "tokenizer.model").write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    specials = ("<pad>", "<s>", "</s>", "<unk>", *ERNIE_SPECIALS)
    config = {
        "tokenizer_class": "Ernie4_5Tokenizer", "add_bos_token": False, "add_eos_token": False,
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
        "cls_token": "<|begin_of_sentence|>", "sep_token": "<|end_of_sentence|>", "mask_token": "<mask:0>",
        "added_tokens_decoder": {str(processor.piece_to_id(t)): {"content": t, "special": True, "lstrip": False,
                                                                 "rstrip": False, "normalized": False,
                                                                 "single_word": False} for t in specials},
        "model_max_length": 131072, "legacy": True, "clean_up_tokenization_spaces": False,
        "spaces_between_special_tokens": False,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    _write_json(directory / "tokenizer_config.json", config)
    return processor.get_piece_size()


def write_hf_tokenizer(directory, vocab_size: int = 600, chat_template: str | None = None, bos: bool = False,
                       template_file: bool = False) -> int:
    """`tokenizer.json` + `tokenizer_config.json` (the template in `chat_template.jinja` with `template_file`)
    in `directory`; returns the vocabulary size (added tokens included): `vocab_size`, at most 498 (all the
    corpus' merges)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + (["<|begin_of_text|>"] if bos else [])
    tokenizer = Tokenizer(models.BPE())
    if not bos:   # Qwen2's tokenizer.json composes characters first (NFC)
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    if bos:
        bos_id = tokenizer.token_to_id("<|begin_of_text|>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", bos_id)])
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.save(str(directory / "tokenizer.json"))
    template = chat_template if chat_template is not None else (LLAMA_STYLE_TEMPLATE if bos else CHATML_TEMPLATE)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast" if bos else "Qwen2Tokenizer",
        "bos_token": "<|begin_of_text|>" if bos else None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "model_max_length": 32768, "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(tokenizer.token_to_id(t)): {"content": t, "special": True, "lstrip": False,
                                                                 "rstrip": False, "normalized": False,
                                                                 "single_word": False} for t in specials},
    }
    if template_file:
        (directory / "chat_template.jinja").write_text(template, encoding="utf-8")
    else:
        config["chat_template"] = template
    _write_json(directory / "tokenizer_config.json", config)
    return tokenizer.get_vocab_size(with_added_tokens=True)
