"""Qwen2 / Qwen2.5 dense (`Qwen2ForCausalLM`; docs/models.md "Llama and Qwen2").

Llama's decoder with a bias on the q, k and v projections (`q_proj.bias`, `k_proj.bias`, `v_proj.bias`; none on
`o_proj` or the MLP), NeoX rotation, no q/k norm; LM head tied or not as `tie_word_embeddings` says. No MTP module.
"""
from __future__ import annotations

from fastdeploy.model_executor.models.checkpoint import CheckpointConfig
from fastdeploy.model_executor.models.decoder_lm import CheckpointLM, DecoderShape, common_shape


class Qwen2ForCausalLM(CheckpointLM):
    ARCHITECTURE = "Qwen2ForCausalLM"

    @classmethod
    def decoder_shape(cls, config: CheckpointConfig) -> DecoderShape:
        if config.get("use_sliding_window", bool, False):
            raise config.invalid("config.json: field 'use_sliding_window' true is not supported (full attention "
                                 "only)")
        return common_shape(config, rope_style="neox", qk_norm=False, tie_default=False, qkv_bias=True)
