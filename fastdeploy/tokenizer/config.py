"""Reads what a checkpoint directory says about its tokenizer besides the vocabulary: `tokenizer_config.json`
(special tokens, `add_bos_token` / `add_eos_token`, added tokens, the chat template) and `chat_template.jinja`.

Every error is a ValueError of one line naming the file and the field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"      # transformers 5 writes the template here
TEMPLATE_JSON_FILE = "chat_template.json"  # {"chat_template": ...}: older processors' file
# The special tokens a tokenizer config names and a chat template sees as variables (transformers' names).
NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "pad_token", "cls_token", "sep_token", "mask_token")
EXTRA_SPECIALS = ("additional_special_tokens", "extra_special_tokens")


@dataclass(frozen=True)
class AddedToken:
    """One entry of `added_tokens_decoder`: text matched before the vocabulary's own splitting."""

    content: str
    special: bool


@dataclass(frozen=True)
class TokenizerConfig:
    tokenizer_class: str | None = None
    named: dict[str, str] = field(default_factory=dict)        # bos_token -> "<s>", ...
    extra_specials: tuple[str, ...] = ()                         # additional special tokens
    added: dict[int, AddedToken] = field(default_factory=dict)   # id -> added token
    add_bos_token: bool | None = None                            # None: the file does not say
    add_eos_token: bool | None = None
    chat_template: str | None = None
    source: bytes = b""                                          # the files' bytes, for the identity

    @property
    def special_strings(self) -> set[str]:
        """Every spelling `decode` skips: the named specials, the extra ones, the added tokens marked special."""
        return {*self.named.values(), *self.extra_specials, *(t.content for t in self.added.values() if t.special)}


def _token_content(value, where: str) -> str | None:
    """A special token is written as a string or as {"content": ...} (transformers' AddedToken form)."""
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str):
        raise ValueError(f"{where}: must be a string or an object with a string 'content'")
    return value


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot read the file ({error})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON (line {error.lineno}: {error.msg})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must hold a JSON object")
    return data


def _flag(data: dict, name: str, path: Path) -> bool | None:
    value = data.get(name)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{path}: field '{name}' must be true or false, got {value!r}")
    return value


def _template(data: dict, directory: Path, path: Path) -> str | None:
    """`chat_template.jinja` first (transformers 5 reads it over the config's field), then the config's
    `chat_template` (a string, or a list of named templates: the one named "default"), then chat_template.json."""
    jinja = directory / TEMPLATE_FILE
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"{jinja}: cannot read the file ({error})") from None
    value = data.get("chat_template")
    if value is None and (directory / TEMPLATE_JSON_FILE).is_file():
        path = directory / TEMPLATE_JSON_FILE
        value = _read_json(path).get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in value):
        named = {t.get("name"): t["template"] for t in value}
        if "default" in named:
            return named["default"]
        raise ValueError(f"{path}: field 'chat_template' lists templates {sorted(map(str, named))} but none "
                         "named 'default'")
    raise ValueError(f"{path}: field 'chat_template' must be a string or a list of {{name, template}}")


def read_tokenizer_config(directory: Path) -> TokenizerConfig:
    """The tokenizer config of a checkpoint directory; an empty config when it has no tokenizer_config.json."""
    path = directory / CONFIG_FILE
    data = _read_json(path) if path.is_file() else {}
    named = {}
    for name in NAMED_SPECIALS:
        content = _token_content(data.get(name), f"{path}: field '{name}'")
        if content is not None:
            named[name] = content
    extra = []
    for name in EXTRA_SPECIALS:
        values = data.get(name) or []
        if isinstance(values, dict):      # transformers 5 may write {name: token}
            values = list(values.values())
        if not isinstance(values, list):
            raise ValueError(f"{path}: field '{name}' must be a list of tokens")
        extra += [_token_content(v, f"{path}: field '{name}[{i}]'") for i, v in enumerate(values)]
    added = {}
    entries = data.get("added_tokens_decoder") or {}
    if not isinstance(entries, dict):
        raise ValueError(f"{path}: field 'added_tokens_decoder' must be an object of id -> token")
    for key, entry in entries.items():
        where = f"{path}: field 'added_tokens_decoder.{key}'"
        if not str(key).isdigit() or not isinstance(entry, dict):
            raise ValueError(f"{where}: must map a token id to an object with 'content'")
        added[int(key)] = AddedToken(_token_content(entry, where), bool(entry.get("special", False)))
    template = _template(data, directory, path)
    source = path.read_bytes() if path.is_file() else b""
    return TokenizerConfig(tokenizer_class=data.get("tokenizer_class"), named=named, extra_specials=tuple(extra),
                           added=added, add_bos_token=_flag(data, "add_bos_token", path),
                           add_eos_token=_flag(data, "add_eos_token", path), chat_template=template,
                           source=source + (template or "").encode())
