"""Shared pytest configuration: registers the markers used across the test tree."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "emulator: runs a Kunlun3 kernel on the host emulator (deselect with -m 'not emulator')")
