"""Speculative-decoding proposers."""
