"""Request sampling defaults from a checkpoint's generation_config.json, as vLLM's `--generation-config` applies
them (docs/serving.md, "Sampling defaults").

`auto` (the default) reads `<--model>/generation_config.json`, a folder path reads that folder's, `vllm` reads none.
The values of `DEFAULTED` found there become the defaults of the requests that do not set the field; a request's own
value always wins. A value SamplingParams refuses stops the server at start with one line naming the file and field.
"""
from __future__ import annotations

import json
from pathlib import Path

from fastdeploy.schema.sampling_params import SamplingParams

# vLLM's `get_diff_sampling_param` list, less max_new_tokens (max_tokens defaults to the rest of the context here)
DEFAULTED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(model: str, setting: str = "auto") -> dict[str, float | int]:
    """{field: value} for the requests that leave `field` unset; ValueError of one line on a bad file or value."""
    if setting == "vllm":
        return {}
    folder = Path(model if setting == "auto" else setting).expanduser()
    path = folder / "generation_config.json"
    if not path.is_file():
        if setting != "auto":
            raise ValueError(f"--generation-config {setting}: no generation_config.json in that folder")
        return {}   # an embedded model, or a checkpoint without one
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: must hold a JSON object")
    defaults = {name: values[name] for name in DEFAULTED if values.get(name) is not None}
    try:
        checked = SamplingParams(**defaults)
    except ValueError as error:
        raise ValueError(f"{path}: {str(error).removeprefix('SamplingParams: ')}") from None
    return {name: getattr(checked, name) for name in defaults}
