"""Tests of the serving processes (SERVICES §8), against real processes on 127.0.0.1."""
