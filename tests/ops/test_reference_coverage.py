"""Branch-coverage review of the NumPy reference (OPS §2.1): the hand-built cases (C2) execute every line of every
reference op's semantics, so every decision-table row is exercised by at least one hand-written expectation."""

import dis
import importlib
import sys

import pytest

import reference
from reference.inputs import run_reference

from . import (test_recover_decode_task, test_speculate_clear_accept_nums, test_speculate_save_output,
               test_speculate_schedule_cache, test_speculate_set_stop_value_multi_seqs,
               test_speculate_set_value_by_flags_and_idx, test_speculate_update)

# The package re-exports each op function under its module's name, so the module is fetched explicitly.
set_stop_module = importlib.import_module("reference.speculate_set_stop_value_multi_seqs")

SEMANTICS = {  # op -> (hand cases, functions holding the op's decision logic)
    "speculate_update": (test_speculate_update.CASES, [reference.speculate_update]),
    "speculate_set_value_by_flags_and_idx": (test_speculate_set_value_by_flags_and_idx.CASES,
                                             [reference.speculate_set_value_by_flags_and_idx]),
    "speculate_set_stop_value_multi_seqs": (test_speculate_set_stop_value_multi_seqs.CASES,
                                            [reference.speculate_set_stop_value_multi_seqs, set_stop_module._matches]),
    "speculate_schedule_cache": (test_speculate_schedule_cache.CASES, [reference.speculate_schedule_cache]),
    "recover_decode_task": (test_recover_decode_task.CASES, [reference.recover_decode_task]),
    "speculate_clear_accept_nums": (test_speculate_clear_accept_nums.CASES, [reference.speculate_clear_accept_nums]),
    "speculate_save_output": (test_speculate_save_output.CASES, [reference.speculate_save_output]),
}


def executable_lines(fn) -> set[int]:
    code = fn.__code__
    return {line for _, line in dis.findlinestarts(code) if line is not None and line != code.co_firstlineno}


@pytest.mark.parametrize("op", list(SEMANTICS))
def test_hand_cases_execute_every_line_of_the_reference(op):
    """Every line of the op's reference semantics runs in at least one hand-built case."""
    cases, functions = SEMANTICS[op]
    codes = {fn.__code__: executable_lines(fn) for fn in functions}
    hit = {code: set() for code in codes}

    def tracer(frame, event, arg):
        if frame.f_code in codes:
            hit[frame.f_code].add(frame.f_lineno)
            return tracer
        return None

    sys.settrace(tracer)
    try:
        for hc in cases:
            run_reference(hc.case)
    finally:
        sys.settrace(None)
    for code, lines in codes.items():
        missing = sorted(lines - hit[code])
        assert not missing, f"{op}: lines of {code.co_name} never executed by a hand case: {missing}"
