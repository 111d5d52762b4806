"""Builds the engine instance an engine core hosts from the API server's parsed flags (`build_instance`).

This is the Paddle side of the engine core: the core imports it by name at process start. Roles plug in here:
`--splitwise-role mixed` is one LLMEngine with prefill and decode in the same instance (PD_MTP_FLOW §1's single
instance).
"""
from __future__ import annotations

import argparse

from fastdeploy.engine.engine import LLMEngine
from fastdeploy.engine.engine_core import EngineInstance
from fastdeploy.entrypoints.openai.serve_args import config_from_args
from fastdeploy.model_executor.models import get_model
from fastdeploy.output.token_processor import TokenProcessor
from fastdeploy.worker import make_runner


def build_instance(args: argparse.Namespace) -> EngineInstance:
    if args.splitwise_role != "mixed":
        raise ValueError(f"build_instance: '--splitwise-role {args.splitwise_role}' is not available in this "
                         f"build (only 'mixed')")
    config = config_from_args(args)
    model = get_model(config.model, dtype=config.dtype)
    return LLMEngine(config, make_runner(config, model), model.eos_token_ids, model.vocab_size, TokenProcessor)
