"""Step-message constants and `decode_step_message`, the decoding counterpart of `speculate_save_output`
(OPS.md §1, §5.7). Pure Python/NumPy: the token processor uses it without Paddle.

Message layout (int64, 1-D): `[±MSG_ID, bsz, c_0 .. c_{bsz-1}, row_0 (T tokens), .., row_{bsz-1}]`.
"""

import numpy as np

PREEMPTED_TOKEN_ID = -9  # count word: the slot was preempted by the scheduler
RECOVERY_STOP = -3  # count word: the request is stopped by the recovery path
MSG_ID = 1  # magnitude of word 0
UNALLOCATED_BLOCK = -1  # block_tables entry with no KV block

_OP = "decode_step_message"


def _fail(what: str):
    raise ValueError(f"{_OP}: {what}")


def decode_step_message(msg):
    """`msg`: 1-D int64 tensor or array. Returns None for an empty message, else `(not_need_stop, slots)` where
    `slots[j]` is `[PREEMPTED_TOKEN_ID]`, `[RECOVERY_STOP]`, `[]` or the slot's tokens as Python ints."""
    data = msg.numpy() if hasattr(msg, "numpy") else np.asarray(msg)
    if data.ndim != 1:
        _fail(f"expected a 1-D message (got shape {list(data.shape)})")
    if data.dtype != np.int64:
        _fail(f"expected dtype int64 (got {data.dtype})")
    words = data.tolist()
    if not words:
        return None
    if len(words) < 2:
        _fail(f"message of length {len(words)} is shorter than its 2-word header")
    if words[0] not in (MSG_ID, -MSG_ID):
        _fail(f"word 0 must be +{MSG_ID} or -{MSG_ID} (got {words[0]})")
    bsz = words[1]
    if bsz < 1:
        _fail(f"bsz (word 1) must be >= 1 (got {bsz})")
    rest = len(words) - 2 - bsz
    if rest < bsz or rest % bsz != 0:
        _fail(f"length {len(words)} does not fit bsz = {bsz} slots of T >= 1 tokens each")
    T = rest // bsz
    # one min() over every token word: without a negative word no slot's tokens need the per-token check
    negative_words = min(words[2 + bsz:]) < 0
    slots = []
    for j, count in enumerate(words[2:2 + bsz]):
        if count in (PREEMPTED_TOKEN_ID, RECOVERY_STOP):
            slots.append([count])
        elif 0 <= count <= T:
            start = 2 + bsz + j * T
            tokens = words[start : start + count]
            if negative_words and any(token < 0 for token in tokens):
                _fail(f"slot {j}: negative token in {tokens}")
            slots.append(tokens)
        else:
            _fail(f"slot {j}: count {count} is neither -9, -3 nor in [0, {T}]")
    return words[0] > 0, slots
