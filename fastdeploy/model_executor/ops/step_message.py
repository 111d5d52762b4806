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
    if not data.size:
        return None
    if data.size < 2:
        _fail(f"message of length {data.size} is shorter than its 2-word header")
    head = int(data[0])
    if head not in (MSG_ID, -MSG_ID):
        _fail(f"word 0 must be +{MSG_ID} or -{MSG_ID} (got {head})")
    bsz = int(data[1])
    if bsz < 1:
        _fail(f"bsz (word 1) must be >= 1 (got {bsz})")
    rest = data.size - 2 - bsz
    if rest < bsz or rest % bsz != 0:
        _fail(f"length {data.size} does not fit bsz = {bsz} slots of T >= 1 tokens each")
    T = rest // bsz
    # checked over every slot at once; the first bad slot is named as a slot-by-slot walk would name it
    counts = data[2:2 + bsz]
    rows = data[2 + bsz:].reshape(bsz, T)
    special = (counts == PREEMPTED_TOKEN_ID) | (counts == RECOVERY_STOP)
    in_range = (counts >= 0) & (counts <= T)
    negative = in_range & ((rows < 0) & (np.arange(T) < counts[:, None])).any(axis=1)
    bad = ~(special | in_range) | negative
    if bad.any():
        j = int(np.argmax(bad))
        count = int(counts[j])
        if negative[j]:
            _fail(f"slot {j}: negative token in {rows[j, :count].tolist()}")
        _fail(f"slot {j}: count {count} is neither -9, -3 nor in [0, {T}]")
    token_rows = rows.tolist()
    slots = [[count] if count < 0 else token_rows[j][:count] for j, count in enumerate(counts.tolist())]
    return head > 0, slots
