"""Shared pytest configuration: registers the markers used across the test tree and the --mutants option."""
import pytest


def pytest_addoption(parser):
    parser.addoption("--mutants", action="store_true",
                     help="also run the tests marked `mutants` (scripts/check_seed_mutants.py, minutes)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "emulator: runs a Kunlun3 kernel on the host emulator (deselect with -m 'not emulator')")
    config.addinivalue_line(
        "markers", "compile_check: compiles the XPU branch with g++ -fsyntax-only (deselect with -m 'not compile_check')")


def pytest_collection_modifyitems(config, items):
    # Opt-in rather than `-m "not mutants"` in addopts: a user's own -m would replace that and run them.
    if config.getoption("--mutants"):
        return
    skip = pytest.mark.skip(reason="seed mutants run only with --mutants (docs/testing.md)")
    for item in items:
        if "mutants" in item.keywords:
            item.add_marker(skip)
