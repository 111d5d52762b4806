"""Reference of `decode_step_message` (OPS §5.7) and the sentinel constants of OPS §1."""

import numpy as np

PREEMPTED_TOKEN_ID = -9
RECOVERY_STOP = -3
MSG_ID = 1
UNALLOCATED_BLOCK = -1

OP = "decode_step_message"


def _fail(what: str):
    raise ValueError(f"{OP}: {what}")


def decode_step_message(msg) -> None | tuple[bool, list[list[int]]]:
    """`msg`: 1-D int64 array (or anything with `.numpy()`). Returns None for an empty message."""
    words = np.asarray(msg.numpy() if hasattr(msg, "numpy") else msg)
    if words.ndim != 1:
        _fail(f"expected a 1-D message (got shape {list(words.shape)})")
    words = [int(w) for w in words]
    if len(words) == 0:
        return None
    if len(words) < 2:
        _fail(f"message of length {len(words)} is shorter than its 2-word header")
    if words[0] not in (MSG_ID, -MSG_ID):
        _fail(f"word 0 must be +/-{MSG_ID} (got {words[0]})")
    bsz = words[1]
    if bsz < 1:
        _fail(f"bsz (word 1) must be >= 1 (got {bsz})")
    rest = len(words) - 2 - bsz
    if rest < bsz or rest % bsz != 0:
        _fail(f"length {len(words)} does not fit bsz {bsz} count words plus bsz rows of T >= 1 tokens")
    T = rest // bsz
    slots = []
    for j in range(bsz):
        c = words[2 + j]
        if c in (PREEMPTED_TOKEN_ID, RECOVERY_STOP):
            slots.append([c])
        elif c == 0:
            slots.append([])
        elif 1 <= c <= T:
            start = 2 + bsz + j * T
            tokens = words[start:start + c]
            if any(t < 0 for t in tokens):
                _fail(f"slot {j} carries a negative token {min(tokens)}")
            slots.append(tokens)
        else:
            _fail(f"slot {j} has count {c}, outside {{-9, -3, 0..{T}}}")
    return words[0] > 0, slots
