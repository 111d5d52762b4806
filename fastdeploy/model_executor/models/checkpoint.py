"""A checkpoint directory as the published releases lay it out (docs/models.md "Checkpoints").

`read_checkpoint_config(path)` reads config.json and generation_config.json and lists the weight files' tensors
(headers only); it imports neither paddle nor torch, so the API server and the tokenizer can call it.
`Checkpoint` reads the weights through `safetensors` (memory-mapped; each tensor once), cast to the engine dtype.

Layout (docs/models.md "Checkpoints"): the torch layout stores linear weights `[out, in]`, the Paddle layout
`[in, out]`. The tensors decide: fused `qkv_proj` / `up_gate_proj` exist only in the Paddle layout, and a
non-square `o_proj` / `down_proj` (out = hidden_size) shows its orientation. Only where every such tensor is square
does config.json's key decide (FastDeploy's `ModelConfig` rule: `torch_dtype` torch, `dtype` Paddle; both or
neither is then refused): transformers >= 4.56 writes `dtype` for the torch layout too.
Weight files (FastDeploy's `get_all_weights_file` order): `model.safetensors`; else `model.safetensors.index.json`
and the shards its `weight_map` names; else every `*.safetensors` in the directory.
Every error is a `CheckpointError`: one line naming the directory and the file, field or tensor.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import numpy as np
from safetensors import SafetensorError, safe_open

from fastdeploy.model_executor.models.file_digests import file_digests
from fastdeploy.precision import kv_storage_dtype

LAYOUTS = ("torch", "paddle")
_STORED_DTYPES = ("F64", "F32", "F16", "BF16")
_MISSING = object()


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be served as it is; the message is one line."""


def _error(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"checkpoint '{path}': {what}")


def _read_json(path: Path, name: str, required: bool) -> dict | None:
    file = path / name
    if not file.is_file():
        if required:
            raise _error(path, f"{name} is missing")
        return None
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _error(path, f"{name} is not readable JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _error(path, f"{name} must hold a JSON object, got {type(value).__name__}")
    return value


def _weight_files(path: Path) -> tuple[tuple[Path, ...], dict[str, str] | None]:
    """The safetensors files of `path` and, for a sharded checkpoint, the index's tensor -> shard map."""
    single = path / "model.safetensors"
    if single.is_file():
        return (single,), None
    index = _read_json(path, "model.safetensors.index.json", required=False)
    if index is not None:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map or \
                not all(isinstance(v, str) for v in weight_map.values()):
            raise _error(path, "model.safetensors.index.json: field 'weight_map' must map tensor names to files")
        shards = []
        for shard in sorted(set(weight_map.values())):
            if Path(shard).name != shard:
                raise _error(path, f"model.safetensors.index.json names shard {shard!r} outside the directory")
            if not (path / shard).is_file():
                raise _error(path, f"{shard} (named by model.safetensors.index.json) is missing")
            shards.append(path / shard)
        return tuple(shards), dict(weight_map)
    files = tuple(sorted(p for p in path.glob("*.safetensors") if p.is_file()))
    if not files:
        found = "" if not any(path.glob("*.pdparams")) else " (*.pdparams files are not read: convert to safetensors)"
        raise _error(path, f"no weights: neither model.safetensors, model.safetensors.index.json nor any "
                           f"*.safetensors file{found}")
    return files, None


def _open(path: Path, file: Path, framework: str = "np"):
    try:
        return safe_open(str(file), framework=framework)
    except (SafetensorError, OSError) as exc:   # truncated, empty, header unreadable
        raise _error(path, f"{file.name} is not a readable safetensors file ({exc})") from None


@dataclass(frozen=True, slots=True)
class TensorInfo:
    file: Path
    shape: tuple[int, ...]
    stored_dtype: str   # safetensors' name: F32, BF16, ...


def _list_tensors(path: Path, files: tuple[Path, ...], weight_map: dict[str, str] | None) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        with _open(path, file) as handle:
            for name in handle.keys():
                view = handle.get_slice(name)
                if name in tensors:
                    raise _error(path, f"tensor '{name}' is in both {tensors[name].file.name} and {file.name}")
                if weight_map is not None and weight_map.get(name) != file.name:
                    raise _error(path, f"tensor '{name}' is in {file.name}, model.safetensors.index.json says "
                                       f"{weight_map.get(name)!r}")
                tensors[name] = TensorInfo(file, tuple(int(d) for d in view.get_shape()), view.get_dtype())
    if weight_map is not None:
        absent = sorted(set(weight_map) - set(tensors))
        if absent:
            more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
            raise _error(path, f"tensor '{absent[0]}' is named by model.safetensors.index.json but missing from "
                               f"{weight_map[absent[0]]}{more}")
    return tensors


def _content_digest(path: Path, files: tuple[Path, ...]) -> str:
    """What names a checkpoint in KV and PD identities: BLAKE3 of config.json and, per weight file, its name and
    the BLAKE3 of every byte of it. Independent of the directory's path (a P and a D on two hosts agree) and
    different whenever any weight differs (a change to one tensor anywhere in any file); each file is read once per
    change of it (`file_digests`), not at every start."""
    digest = blake3.blake3((path / "config.json").read_bytes())
    for file in files:
        digest.update(f"|{file.name}:{file_digests.digest(file)}|".encode())
    return digest.hexdigest(16)


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """What the engine needs from a checkpoint directory before loading any weight."""

    path: Path
    architecture: str
    model_type: str
    max_position_embeddings: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    has_mtp_weights: bool
    layout: str                      # "torch" or "paddle"
    raw: dict = field(repr=False)    # config.json as read
    generation: dict = field(repr=False)   # generation_config.json ({} when absent)
    tensors: dict[str, TensorInfo] = field(repr=False)
    identity: str = ""               # content digest (_content_digest): the same checkpoint anywhere, not its path

    def get(self, name: str, kind: type | tuple[type, ...] = int, default=_MISSING):
        """Field `name` of config.json, checked to be of `kind`; CheckpointError naming it when missing or not."""
        if name not in self.raw or self.raw[name] is None:
            if default is _MISSING:
                raise _error(self.path, f"config.json: field '{name}' is missing")
            return default
        value = self.raw[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = "/".join(k.__name__ for k in kinds)
            raise _error(self.path, f"config.json: field '{name}' must be {names}, got {value!r}")
        if int in kinds and isinstance(value, int) and not isinstance(value, bool) and value < 1 and \
                name not in ("pad_token_id", "bos_token_id", "eos_token_id"):
            raise _error(self.path, f"config.json: field '{name}' must be positive, got {value}")
        return value

    def kv_bytes_per_token(self, dtype: str, with_mtp: bool) -> int:
        """KV bytes one token takes in the engine's cache (K and V of every KV head of every layer, plus the MTP
        module's layer when `with_mtp`), from the Llama-like fields every supported family has."""
        heads = self.get("num_attention_heads")
        head_dim = self.get("head_dim", int, self.get("hidden_size") // heads)
        layers = self.get("num_hidden_layers")
        if with_mtp:   # one MTP layer: the only MTP module served (ERNIE's), wherever its weights are stored
            layers += 1
        itemsize = kv_storage_dtype(dtype).itemsize   # "bfloat16": 2
        return layers * 2 * self.get("num_key_value_heads", int, heads) * head_dim * itemsize

    def invalid(self, what: str) -> CheckpointError:
        """A CheckpointError about this checkpoint (for the model files' own checks)."""
        return _error(self.path, what)


def _eos_ids(path: Path, generation: dict, raw: dict) -> tuple[int, ...]:
    for source, values in (("generation_config.json", generation), ("config.json", raw)):
        value = values.get("eos_token_id")
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise _error(path, f"{source}: field 'eos_token_id' must be a token id or a list of them, got {value!r}")
        return tuple(dict.fromkeys(ids))
    raise _error(path, "no EOS token: field 'eos_token_id' is in neither generation_config.json nor config.json")


def read_checkpoint_config(path: str | Path) -> CheckpointConfig:
    """The configuration of the checkpoint directory `path` (weights' headers read, no weight loaded)."""
    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise CheckpointError(f"checkpoint '{path}': not a directory")
    raw = _read_json(path, "config.json", required=True)
    generation = _read_json(path, "generation_config.json", required=False) or {}
    architectures = raw.get("architectures")
    if not isinstance(architectures, list) or not architectures or not isinstance(architectures[0], str):
        raise _error(path, f"config.json: field 'architectures' must be a non-empty list of names, "
                           f"got {architectures!r}")
    files, weight_map = _weight_files(path)
    tensors = _list_tensors(path, files, weight_map)
    layout = _layout(path, raw, tensors)
    partial = CheckpointConfig(path, architectures[0], "", 0, 0, (), False, layout, raw, generation, tensors)
    return CheckpointConfig(
        path=path, architecture=architectures[0], model_type=partial.get("model_type", str),
        max_position_embeddings=partial.get("max_position_embeddings"), vocab_size=partial.get("vocab_size"),
        eos_token_ids=_eos_ids(path, generation, raw),
        has_mtp_weights=any(".mtp_" in name or name.startswith("mtp_") for name in tensors),
        layout=layout, raw=raw, generation=generation, tensors=tensors, identity=_content_digest(path, files))


def _layout(path: Path, raw: dict, tensors: dict[str, TensorInfo]) -> str:
    """"torch" or "paddle", from the tensors where they show it, else from config.json's dtype key."""
    hidden = raw.get("hidden_size")
    for name, info in tensors.items():
        if name.endswith(("qkv_proj.weight", "up_gate_proj.weight")):
            return "paddle"
        if name.endswith(("o_proj.weight", "down_proj.weight")) and len(info.shape) == 2 \
                and info.shape[0] != info.shape[1] and hidden in info.shape:
            return "torch" if info.shape[0] == hidden else "paddle"
    if "torch_dtype" in raw and "dtype" in raw:
        raise _error(path, "config.json: only one of 'torch_dtype' (torch layout) and 'dtype' (Paddle layout) "
                           "may be given (every projection is square: the tensors do not tell the layout)")
    if "torch_dtype" not in raw and "dtype" not in raw:
        raise _error(path, "config.json: unknown model format: neither 'torch_dtype' (torch layout) nor 'dtype' "
                           "(Paddle layout) is given, and every projection is square")
    return "torch" if "torch_dtype" in raw else "paddle"


class Checkpoint:
    """The weights of a checkpoint directory. `tensor(name, dtype)` reads one tensor (memory-mapped; each name at
    most once: a second read is a loader bug) as a NumPy array of `dtype`; `unread()` names what no read asked for."""

    def __init__(self, config: CheckpointConfig | str | Path):
        self.config = config if isinstance(config, CheckpointConfig) else read_checkpoint_config(config)
        self.path = self.config.path
        self._handles: dict[Path, object] = {}
        self._read: set[str] = set()

    @property
    def names(self) -> list[str]:
        return sorted(self.config.tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._info(name).shape

    def has(self, name: str) -> bool:
        return name in self.config.tensors

    def _info(self, name: str) -> TensorInfo:
        info = self.config.tensors.get(name)
        if info is None:
            raise _error(self.path, f"tensor '{name}' is missing")
        return info

    def tensor(self, name: str, dtype: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Tensor `name` as `dtype` ("float32" or "float64"); with `shape`, refused by name unless it has it."""
        info = self._info(name)
        if shape is not None and info.shape != tuple(shape):
            raise _error(self.path, f"tensor '{name}' has shape {list(info.shape)}, the config implies "
                                    f"{list(shape)}")
        if name in self._read:
            raise RuntimeError(f"Checkpoint.tensor: '{name}' of {self.path} read twice")
        if info.stored_dtype not in _STORED_DTYPES:
            raise _error(self.path, f"tensor '{name}' is stored as {info.stored_dtype}; floating point "
                                    f"{'/'.join(_STORED_DTYPES)} only")
        self._read.add(name)
        try:
            if info.stored_dtype == "BF16":
                return self._bfloat16(info.file, name).astype(dtype)
            return np.asarray(self._handle(info.file, "np").get_tensor(name)).astype(dtype, copy=False)
        except SafetensorError as exc:   # data cut short after a readable header
            raise _error(self.path, f"tensor '{name}' in {info.file.name} is not readable ({exc})") from None

    def _bfloat16(self, file: Path, name: str) -> np.ndarray:
        """NumPy has no bfloat16: Paddle's reader gives it, widened to float32 exactly (bfloat16 is the top half of
        a float32)."""
        import paddle   # only the bfloat16 path needs it; the model that reads the tensor uses Paddle anyway
        return self._handle(file, "paddle").get_tensor(name).astype(paddle.float32).numpy()

    def _handle(self, file: Path, framework: str):
        key = (file, framework)
        if key not in self._handles:
            self._handles[key] = _open(self.path, file, framework)
        return self._handles[key]

    def skip(self, names) -> None:
        """Tensors present but deliberately not loaded (an MTP module nobody asked for): unread() omits them."""
        self._read.update(names)

    def unread(self) -> list[str]:
        return sorted(set(self.config.tensors) - self._read)

    def close(self) -> None:
        self._handles.clear()   # safe_open handles unmap when collected
