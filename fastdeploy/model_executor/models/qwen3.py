"""Qwen3 dense (`Qwen3ForCausalLM`; docs/models.md "Qwen3 dense").

Pre-norm decoder: RMSNorm, GQA attention without bias whose q and k heads are each RMS-normalised over head_dim
(`q_norm`, `k_norm`) before the rotary embedding, NeoX (halves) rotation, explicit `head_dim` (not necessarily
hidden / heads), SwiGLU MLP; LM head tied or not as `tie_word_embeddings` says. No MTP module.
"""
from __future__ import annotations

from fastdeploy.model_executor.models.checkpoint import CheckpointConfig
from fastdeploy.model_executor.models.decoder_lm import CheckpointLM, DecoderShape, common_shape


class Qwen3ForCausalLM(CheckpointLM):
    ARCHITECTURE = "Qwen3ForCausalLM"

    @classmethod
    def decoder_shape(cls, config: CheckpointConfig) -> DecoderShape:
        if config.get("attention_bias", bool, False):
            raise config.invalid("config.json: field 'attention_bias' true is not supported (Qwen3 has no "
                                 "attention bias)")
        if config.get("use_sliding_window", bool, False):
            raise config.invalid("config.json: field 'use_sliding_window' true is not supported (full attention "
                                 "only)")
        # transformers' Qwen3Config defaults: tied embeddings off unless the config says so
        return common_shape(config, rope_style="neox", qk_norm=True, tie_default=False)
