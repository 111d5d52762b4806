"""The torch side of the ERNIE-4.5 MoE + MTP oracle: transformers' `Ernie4_5_MoeForCausalLM` on CPU torch, plus an
ERNIE MTP module assembled from transformers' modules in FastDeploy's convention (docs/models.md "ERNIE-4.5 MoE
and MTP").

Run ONLY as a subprocess (`python tests/reference/ernie4_5_moe_torch.py < request.json`): torch must never share a
process with paddle. One JSON request on stdin, one JSON answer on stdout. Commands:

  write       build a tiny random checkpoint with transformers, `save_pretrained` it (the torch layout), add the
              MTP tensors under their published names (in the same file, or in `mtp_directory`), and fit the MTP's
              projection so that it agrees with the target often but not always (below)
  generate    greedy continuation of each prompt: tokens and the log-probability of each chosen token
  mtp_logits  the MTP module's logits at every position p of each sequence, from (token at p + 1, the target's
              hidden state at p)

The MTP module (FastDeploy `ernie4_5_mtp.py`; docs/models.md "ERNIE-4.5 MoE and MTP"): at position p, with t = token at p + 1 and h the
target's output at p AFTER its final norm,
    x = mtp_linear_proj(concat[mtp_emb_norm(embed(t)), mtp_hidden_norm(h)])      (2H -> H, embedding first)
    y = mtp_block.0(x)                         one dense decoder block (intermediate_size), causal over MTP positions
    logits = lm_head(norm(y))                  the target's final norm and head, shared
with rotary position p (FastDeploy's and vLLM's; transformers' own MtpModel uses p + 1, the same scores since
rotary attention depends on position differences only).

The fit (`write` with "mtp_fit"): random weights make an MTP that never agrees with its target, so a losslessness
test with it would pass without a single accepted draft. The writer runs the target greedily on random prompts,
collects the MTP block's input rows and, as the regression target, the target's last hidden state BEFORE the
final norm at p + 1 (the norm and head are shared, so an MTP output equal to it predicts what the target
predicts at p + 1, i.e. the token at p + 2); the block's residual stream is kept close to the identity (its output
projections scaled down), and `mtp_linear_proj` is the ridge-regression solution, plus Gaussian noise of
relative size `mtp_noise` so that some drafts are rejected. The agreement measured on held-out prompts is reported.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM
from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeDecoderLayer, Ernie4_5_MoeRMSNorm

MTP_PREFIX = "model."
MTP_NAMES = ("mtp_emb_norm.0.weight", "mtp_hidden_norm.0.weight", "mtp_linear_proj.0.weight")


def _config(fields: dict) -> Ernie4_5_MoeConfig:
    fields = dict(fields)
    theta = fields.pop("rope_theta", 500000.0)
    return Ernie4_5_MoeConfig(**fields, rope_parameters={"rope_type": "default", "rope_theta": theta},
                              attn_implementation="eager")


class MTP(torch.nn.Module):
    """ERNIE's MTP module over a target model's embedding, final norm and head (shared, not copied)."""

    def __init__(self, target: Ernie4_5_MoeForCausalLM):
        super().__init__()
        cfg = target.config
        block_cfg = Ernie4_5_MoeConfig(**{**cfg.to_dict(), "moe_layer_start_index": cfg.num_hidden_layers + 1,
                                          "moe_layer_end_index": cfg.num_hidden_layers + 1})
        block_cfg._attn_implementation = "eager"
        h = cfg.hidden_size
        self.emb_norm = Ernie4_5_MoeRMSNorm(h, cfg.rms_norm_eps)
        self.hidden_norm = Ernie4_5_MoeRMSNorm(h, cfg.rms_norm_eps)
        self.linear_proj = torch.nn.Linear(2 * h, h, bias=False)
        self.block = Ernie4_5_MoeDecoderLayer(block_cfg, 0)        # dense: its index is below the MoE range
        self.target = [target]                                     # not a submodule: shared, never saved twice

    def block_input(self, next_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        embed = self.target[0].model.embed_tokens(next_ids)
        return torch.cat([self.emb_norm(embed), self.hidden_norm(hidden)], dim=-1)

    def forward(self, next_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """next_ids [1, n] (token at p + 1), hidden [1, n, H] (target, post-norm, at p) -> logits [1, n, V]."""
        target = self.target[0]
        x = self.linear_proj(self.block_input(next_ids, hidden))
        positions = torch.arange(x.shape[1])[None]
        n = x.shape[1]
        mask = torch.full((n, n), float("-inf"), dtype=x.dtype).triu(1)[None, None]
        y = self.block(x, attention_mask=mask, position_ids=positions,
                       position_embeddings=target.model.rotary_emb(x, positions))
        return target.lm_head(target.model.norm(y))

    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        self.emb_norm.weight.data.copy_(tensors[MTP_PREFIX + "mtp_emb_norm.0.weight"])
        self.hidden_norm.weight.data.copy_(tensors[MTP_PREFIX + "mtp_hidden_norm.0.weight"])
        self.linear_proj.weight.data.copy_(tensors[MTP_PREFIX + "mtp_linear_proj.0.weight"])
        block = {name[len(MTP_PREFIX + "mtp_block.0."):]: value for name, value in tensors.items()
                 if name.startswith(MTP_PREFIX + "mtp_block.0.")}
        self.block.load_state_dict(block, strict=True)

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {MTP_PREFIX + "mtp_emb_norm.0.weight": self.emb_norm.weight,
               MTP_PREFIX + "mtp_hidden_norm.0.weight": self.hidden_norm.weight,
               MTP_PREFIX + "mtp_linear_proj.0.weight": self.linear_proj.weight}
        out.update({MTP_PREFIX + "mtp_block.0." + name: value for name, value in self.block.state_dict().items()})
        return {name: value.detach().contiguous().clone() for name, value in out.items()}


def _randomise(model: Ernie4_5_MoeForCausalLM, mtp: MTP, gen: torch.Generator, std: float, bias_std: float) -> None:
    """Weights that make the numerics decide: norms away from 1 (so swapping or skipping one shows), a correction
    bias that moves the top-k, and projections large enough that greedy text is not one repeated token."""
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *(("mtp." + n, q) for n, q in mtp.named_parameters())]:
            if name.endswith("norm.weight") or "layernorm" in name or "_norm" in name:
                p.copy_(1.0 + 0.3 * (2 * torch.rand(p.shape, generator=gen) - 1))
            elif "e_score_correction_bias" in name:
                p.copy_(bias_std * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else 1
                p.copy_(torch.randn(p.shape, generator=gen) * (std if "embed" in name else 1.0 / math.sqrt(fan_in)))


@torch.no_grad()
def _greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    ids = torch.tensor([prompt])
    out = model(ids, use_cache=True)
    cache, tokens, logprobs = out.cache, [], []
    for _ in range(steps):
        lp = torch.log_softmax(out.logits[0, -1].double(), dim=-1)
        token = int(lp.argmax())
        tokens.append(token)
        logprobs.append(float(lp[token]))
        out = model(torch.tensor([[token]]), cache=cache, use_cache=True)
        cache = out.cache
    return tokens, logprobs


@torch.no_grad()
def _pre_norm(model, sequence: list[int]) -> torch.Tensor:
    captured = {}
    handle = model.model.norm.register_forward_hook(lambda mod, args, out: captured.setdefault("x", args[0]))
    model.model(torch.tensor([sequence]))
    handle.remove()
    return captured["x"]


@torch.no_grad()
def _fit(model, mtp: MTP, gen: torch.Generator, vocab: int, noise: float, samples: int) -> float:
    """Ridge fit of mtp_linear_proj (see the module docstring); returns the held-out greedy agreement."""
    def rows(prompts):
        xs, ys, seqs = [], [], []
        for prompt in prompts:
            tokens, _ = _greedy(model, prompt, 24)
            seq = prompt + tokens
            post = model.model(torch.tensor([seq])).last_hidden_state
            pre = _pre_norm(model, seq)
            xs.append(mtp.block_input(torch.tensor([seq[1:]]), post[:, :-1])[0])
            ys.append(pre[0, 1:])
            seqs.append(seq)
        return torch.cat(xs).double(), torch.cat(ys).double(), seqs

    def prompts(n):
        return [torch.randint(3, vocab, (int(torch.randint(3, 9, (1,), generator=gen)),), generator=gen).tolist()
                for _ in range(n)]

    x, y, _ = rows(prompts(samples))
    lam = 1e-3 * x.shape[0]
    w = torch.linalg.solve(x.T @ x + lam * torch.eye(x.shape[1], dtype=x.dtype), x.T @ y)   # [2H, H]
    w = w + noise * w.std() * torch.randn(w.shape, generator=gen, dtype=w.dtype)
    mtp.linear_proj.weight.copy_(w.T.to(mtp.linear_proj.weight.dtype))
    agree = total = 0
    for seq in rows(prompts(8))[2]:
        post = model.model(torch.tensor([seq])).last_hidden_state
        drafts = mtp(torch.tensor([seq[1:]]), post[:, :-1])[0].argmax(-1)     # draft for position p + 2
        agree += int((drafts[:-1] == torch.tensor(seq[2:])).sum())
        total += len(seq) - 2
    return agree / total


def write(req: dict) -> dict:
    directory = Path(req["directory"])
    gen = torch.Generator().manual_seed(int(req.get("seed", 0)))
    torch.manual_seed(int(req.get("seed", 0)))
    model = Ernie4_5_MoeForCausalLM(_config(req["config"])).eval()
    mtp = MTP(model).eval()
    _randomise(model, mtp, gen, float(req.get("embed_std", 0.1)), float(req.get("bias_std", 0.05)))
    with torch.no_grad():   # the block close to the identity, so a fitted projection carries through it
        mtp.block.self_attn.o_proj.weight.mul_(0.1)
        mtp.block.mlp.down_proj.weight.mul_(0.1)
    agreement = None
    if req.get("mtp_fit", True):
        agreement = _fit(model, mtp, gen, model.config.vocab_size, float(req.get("mtp_noise", 0.05)),
                         int(req.get("fit_prompts", 48)))
    model.save_pretrained(directory)
    # the published torch-layout config.json names its dtype `torch_dtype` (transformers 5 writes `dtype`) and
    # rope_theta at the top level; the MTP layer count as the ERNIE configs do
    config = json.loads((directory / "config.json").read_text())
    config["torch_dtype"] = config.pop("dtype", "float32")
    config["rope_theta"] = config.pop("rope_parameters", {}).get("rope_theta", 500000.0)
    config["num_nextn_predict_layers"] = 1
    mtp_tensors = mtp.tensors()
    if req.get("mtp_directory"):
        mtp_dir = Path(req["mtp_directory"])
        mtp_dir.mkdir(parents=True, exist_ok=True)
        save_file(mtp_tensors, mtp_dir / "model.safetensors", metadata={"format": "pt"})
        (mtp_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        config["num_nextn_predict_layers"] = 0
    elif req.get("with_mtp", True):
        weights = directory / "model.safetensors"
        save_file({**load_file(weights), **mtp_tensors}, weights, metadata={"format": "pt"})
    else:
        config["num_nextn_predict_layers"] = 0
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {"mtp_agreement": agreement, "mtp_tensors": sorted(mtp_tensors)}


def _load(req: dict) -> tuple[Ernie4_5_MoeForCausalLM, MTP | None]:
    directory = Path(req["directory"])
    model = Ernie4_5_MoeForCausalLM.from_pretrained(directory, attn_implementation="eager",
                                                    experts_implementation="eager").eval()
    if req.get("dtype", "float64") == "float64":
        model = model.double()
    mtp = None
    mtp_dir = Path(req.get("mtp_directory") or directory)
    tensors = {k: v for k, v in load_file(mtp_dir / "model.safetensors").items() if ".mtp_" in k}
    if tensors:
        mtp = MTP(model).eval()
        mtp.load(tensors)
        mtp.to(next(model.parameters()).dtype)
    return model, mtp


def generate(req: dict) -> dict:
    model, _ = _load(req)
    tokens, logprobs = [], []
    for prompt in req["prompts"]:
        t, lp = _greedy(model, prompt, int(req["max_new_tokens"]))
        tokens.append(t)
        logprobs.append(lp)
    return {"tokens": tokens, "logprobs": logprobs}


@torch.no_grad()
def mtp_logits(req: dict) -> dict:
    model, mtp = _load(req)
    if mtp is None:
        raise SystemExit(f"ernie4_5_moe_torch: no MTP tensors in {req.get('mtp_directory') or req['directory']}")
    native = _native_mtp(model, req)
    out, native_diff = [], None
    for seq in req["sequences"]:
        post = model.model(torch.tensor([seq])).last_hidden_state
        logits = mtp(torch.tensor([seq[1:]]), post[:, :-1])[0]
        out.append(logits.double().tolist())
        if native is not None:
            # transformers' own ERNIE MTP: rotary positions p + 1 (see the module docstring)
            h = native.forward_layer(0, post[:, :-1], torch.arange(1, len(seq))[None], None,
                                     input_ids=torch.tensor([seq[1:]]))
            diff = float((native._project_to_logits(h)[0] - logits).abs().max())
            native_diff = diff if native_diff is None else max(native_diff, diff)
    return {"logits": out, "native_max_diff": native_diff}


def _native_mtp(model, req: dict):
    """transformers' generic MtpModel (5.x) loads ERNIE's MTP tensors from the main directory by itself: a second,
    independent assembly to check this one against. None where it is absent or the MTP lives elsewhere."""
    try:
        from transformers.modeling_layers import MtpModel
    except ImportError:
        return None
    if req.get("mtp_directory") or not getattr(model.config, "num_mtp_layers", None):
        return None
    return MtpModel.from_pretrained(model).to(next(model.parameters()).dtype).eval()


COMMANDS = {"write": write, "generate": generate, "mtp_logits": mtp_logits}

if __name__ == "__main__":
    torch.set_num_threads(1)
    request = json.load(sys.stdin)
    json.dump(COMMANDS[request["command"]](request), sys.stdout)
