"""Operator tools: `python -m fastdeploy.tools.kunlun_selfcheck` checks a Kunlun P800 machine (docs/kunlun3.md)."""
