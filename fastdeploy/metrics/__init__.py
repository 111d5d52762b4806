"""Prometheus metrics of the serving processes (SERVICES §4)."""
