"""ERNIE-4.5 dense (`Ernie4_5ForCausalLM`, the 0.3B family; docs/models.md "ERNIE-4.5 dense").

A Llama-like pre-norm decoder: RMSNorm, GQA attention without bias or q/k norm, rotary embedding in the
interleaved (GPT-J) variant over the full head_dim, SwiGLU MLP; LM head tied to the embedding unless
`tie_word_embeddings` is false. Tensors: `model.` (torch layout) or `ernie.` (Paddle layout) prefix, q/k/v and
gate/up separate or fused (`qkv_proj`, `up_gate_proj`).
"""
from __future__ import annotations

from fastdeploy.model_executor.models.checkpoint import CheckpointConfig
from fastdeploy.model_executor.models.decoder_lm import CheckpointLM, DecoderShape, common_shape


class Ernie4_5ForCausalLM(CheckpointLM):
    ARCHITECTURE = "Ernie4_5ForCausalLM"

    @classmethod
    def decoder_shape(cls, config: CheckpointConfig) -> DecoderShape:
        if config.get("use_bias", bool, False):
            raise config.invalid("config.json: field 'use_bias' true is not supported (the released ERNIE-4.5 "
                                 "checkpoints have no linear bias)")
        return common_shape(config, rope_style="interleaved", qk_norm=False, tie_default=True)
