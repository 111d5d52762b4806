"""Train fd-tiny (target + MTP module jointly) on a generated corpus and write its weights.

Deterministic: fixed seeds, one CPU thread, a corpus of templated English sentences produced by this script
(nothing downloaded, so the weights are redistributable). Prints the loss and, at the end, the greedy MTP
acceptance on held-out prompts (K = 1: fraction of MTP drafts equal to the target's next greedy token), measured
through the serving interface (paged KV cache).

    python scripts/train_fd_tiny.py [--steps N] [--out fastdeploy/model_executor/models/weights/fd_tiny.npz]
"""
from __future__ import annotations

import os

# one thread for reproducible float reductions; set before paddle starts its thread pools
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from fastdeploy.model_executor.layers.transformer import DenseCausalAttention  # noqa: E402
from fastdeploy.model_executor.models.base import ForwardBatch  # noqa: E402
from fastdeploy.model_executor.models.fd_tiny import (WEIGHTS_PATH, FdTiny, FdTinyConfig, FdTinyNet,  # noqa: E402
                                                      save_weights)
from fastdeploy.model_executor.models.tokenizer import EOS_ID, ByteTokenizer  # noqa: E402

NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Mallory", "Oscar"]
CITIES = ["Paris", "Berlin", "Madrid", "Rome", "Vienna", "Oslo", "Lisbon", "Prague", "Dublin", "Athens"]
ADJECTIVES = ["red", "small", "happy", "old", "quiet", "bright", "green", "lazy", "quick", "brave"]
NOUNS = ["cat", "dog", "bird", "fox", "horse", "rabbit", "teacher", "farmer", "child", "robot"]
VERBS = ["sees", "likes", "follows", "helps", "finds", "watches", "calls", "meets"]
FRUITS = ["apples", "pears", "plums", "lemons", "oranges", "grapes", "cherries", "peaches"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def sentence(rng: random.Random) -> str:
    """One templated sentence."""
    kind = rng.randrange(6)
    if kind == 0:
        return (f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(VERBS)} "
                f"the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}.")
    if kind == 1:
        return f"{rng.choice(NAMES)} has {rng.randint(2, 9)} {rng.choice(FRUITS)}."
    if kind == 2:
        return f"{rng.choice(NAMES)} lives in {rng.choice(CITIES)}."
    if kind == 3:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        return f"{a} plus {b} is {a + b}."
    if kind == 4:
        return f"On {rng.choice(DAYS)}, {rng.choice(NAMES)} travels to {rng.choice(CITIES)}."
    return f"name: {rng.choice(NAMES)}, age: {rng.randint(18, 80)}, city: {rng.choice(CITIES)}."


def document(rng: random.Random, tok: ByteTokenizer) -> list[int]:
    """BOS, one to three sentences, EOS."""
    text = " ".join(sentence(rng) for _ in range(rng.randint(1, 3)))
    return tok.encode(text) + [EOS_ID]


def make_batch(rng: random.Random, tok: ByteTokenizer, batch_size: int, seq_len: int) -> np.ndarray:
    """[batch_size, seq_len + 1] ids: each row starts at a document boundary (position 0 = BOS, as at inference)
    and is filled with further documents."""
    rows = []
    for _ in range(batch_size):
        row: list[int] = []
        while len(row) < seq_len + 1:
            row += document(rng, tok)
        rows.append(row[:seq_len + 1])
    return np.asarray(rows, np.int64)


def losses(net: FdTinyNet, ids: np.ndarray) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Target next-token loss and MTP (token at p + 2) loss on ids [B, T + 1]."""
    b, t1 = ids.shape
    t = t1 - 1
    x = paddle.to_tensor(ids[:, :t].reshape(-1))
    positions = paddle.to_tensor(np.tile(np.arange(t), b))
    hidden = net.target_hidden(x, positions, DenseCausalAttention(b, t))                   # [B*T, H]
    target_loss = F.cross_entropy(net.logits(hidden), paddle.to_tensor(ids[:, 1:].reshape(-1, 1)))
    # MTP input at p in 0..T-2: (hidden at p, token p + 1); label: token p + 2
    prev = hidden.reshape([b, t, -1])[:, :t - 1].reshape([b * (t - 1), -1])
    mtp_pos = paddle.to_tensor(np.tile(np.arange(t - 1), b))
    mtp_hidden = net.mtp_hidden(prev, paddle.to_tensor(ids[:, 1:t].reshape(-1)), mtp_pos,
                                DenseCausalAttention(b, t - 1))
    mtp_loss = F.cross_entropy(net.mtp_logits(mtp_hidden), paddle.to_tensor(ids[:, 2:t1].reshape(-1, 1)))
    return target_loss, mtp_loss


def greedy_acceptance(model: FdTiny, prompts: list[list[int]], max_new_tokens: int) -> tuple[int, int, list[str]]:
    """(accepted, drafted, texts): greedy decoding through the paged interface; at every generated position the
    MTP module drafts the token after next (K = 1) and the draft is compared with the target's choice."""
    accepted = drafted = 0
    texts = []
    for prompt in prompts:
        kv = model.new_kv_cache(num_blocks=(len(prompt) + max_new_tokens) // 16 + 2, block_size=16)
        table = np.arange(kv.num_blocks, dtype=np.int32)[None, :]
        n = len(prompt)
        logits, hidden = model.forward(ForwardBatch(prompt, np.arange(n), [0, n], table), kv)
        tokens = list(prompt) + [int(logits.numpy()[-1].argmax())]
        mtp_in = ForwardBatch(tokens[1:], np.arange(n), [0, n], table)   # MTP prefill: (h_p, token p + 1)
        mtp_logits, _ = model.mtp_forward(mtp_in, hidden, kv)
        draft = int(mtp_logits.numpy()[-1].argmax())                     # guess for position n + 1
        while tokens[-1] != EOS_ID and len(tokens) - n < max_new_tokens:
            p = len(tokens) - 1
            logits, hidden = model.forward(ForwardBatch([tokens[-1]], [p], [0, 1], table), kv)
            nxt = int(logits.numpy()[0].argmax())
            drafted += 1
            accepted += int(draft == nxt)
            tokens.append(nxt)
            mtp_logits, _ = model.mtp_forward(ForwardBatch([nxt], [p], [0, 1], table), hidden, kv)
            draft = int(mtp_logits.numpy()[0].argmax())
        texts.append(model.tokenizer.decode(tokens))
    return accepted, drafted, texts


def held_out_prompts(rng: random.Random, tok: ByteTokenizer, count: int) -> list[list[int]]:
    """Prefixes (two to four words) of fresh documents."""
    prompts = []
    for _ in range(count):
        words = sentence(rng).split(" ")
        prompts.append(tok.encode(" ".join(words[:rng.randint(2, 4)]) + " "))
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument("--seq-len", type=int, default=96)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--mtp-weight", type=float, default=1.0, help="weight of the MTP loss")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--eval-prompts", type=int, default=40)
    parser.add_argument("--out", type=Path, default=WEIGHTS_PATH)
    args = parser.parse_args()

    paddle.seed(args.seed)
    paddle.set_device("cpu")
    data_rng, eval_rng = random.Random(args.seed), random.Random(args.seed + 1)
    tok = ByteTokenizer()
    net = FdTinyNet(FdTinyConfig())
    warmup = max(1, args.steps // 20)
    schedule = paddle.optimizer.lr.LambdaDecay(
        args.lr, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    opt = paddle.optimizer.AdamW(learning_rate=schedule, parameters=net.parameters(), weight_decay=0.01,
                                 grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    params = sum(int(np.prod(p.shape)) for p in net.parameters())
    print(f"fd-tiny: {params} parameters, {args.steps} steps of {args.batch_size} x {args.seq_len} tokens")
    start = time.time()
    for step in range(1, args.steps + 1):
        target_loss, mtp_loss = losses(net, make_batch(data_rng, tok, args.batch_size, args.seq_len))
        (target_loss + args.mtp_weight * mtp_loss).backward()
        opt.step()
        opt.clear_grad()
        schedule.step()
        if step % 25 == 0 or step == args.steps:
            print(f"step {step:5d}  target loss {float(target_loss):.4f}  mtp loss {float(mtp_loss):.4f}  "
                  f"{time.time() - start:6.1f} s", flush=True)
    train_s = time.time() - start

    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_weights(net, args.out)
    model = FdTiny.from_pretrained(weights_path=args.out)
    accepted, drafted, texts = greedy_acceptance(model, held_out_prompts(eval_rng, tok, args.eval_prompts), 64)
    for text in texts[:3]:
        print("sample:", repr(text))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB); training {train_s:.0f} s; "
          f"final target loss {float(target_loss):.4f}, mtp loss {float(mtp_loss):.4f}")
    print(f"MTP acceptance (greedy, K=1, {len(texts)} held-out prompts): {accepted}/{drafted} = "
          f"{accepted / max(drafted, 1):.3f}")


if __name__ == "__main__":
    main()
