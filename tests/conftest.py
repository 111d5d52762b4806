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


# The longest files (minutes of the suite's time on two cores, measured with --durations=0), run first: with
# `-n 3 --dist=loadfile --no-loadscope-reorder` (pyproject.toml) a worker takes a whole file at a time in collection
# order, and a long file collected last keeps one worker busy after the others ran out of work.
LONGEST_FIRST = (
    "tests/mutants/test_seed_mutants.py",   # with --mutants (CI)
    "tests/native/test_sanitizers.py",
    "tests/hosts/test_faults_across_hosts.py",
    "tests/services/test_flood.py",
    "tests/ops/test_op_parity.py",
    "tests/services/test_router_oracle.py",
    "tests/hosts/test_pd_across_hosts.py",
    "tests/models/test_precision_mtp.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(LONGEST_FIRST)))   # stable: others keep order
    # Opt-in rather than `-m "not mutants"` in addopts: a user's own -m would replace that and run them.
    if config.getoption("--mutants"):
        return
    skip = pytest.mark.skip(reason="seed mutants run only with --mutants (docs/testing.md)")
    for item in items:
        if "mutants" in item.keywords:
            item.add_marker(skip)
