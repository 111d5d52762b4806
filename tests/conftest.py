"""Shared pytest configuration: registers the markers used across the test tree."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "emulator: runs a Kunlun3 kernel on the host emulator (deselect with -m 'not emulator')")
    config.addinivalue_line(
        "markers", "compile_check: compiles the XPU branch with g++ -fsyntax-only (deselect with -m 'not compile_check')")
