"""Reapplies each of the four seed defects of PD_MTP_FLOW §8 to a scratch copy of the tree and reports whether the
tests that guard its fix catch it (docs/testing.md, "Seed mutants").

Each mutant is an exact text patch (old snippet → new snippet; the old snippet must occur exactly once, so the
script fails loudly when the code moves). Defect (2) has two mutants, the C++ CPU path and the Kunlun3 kernel,
each guarded by its own tests. The copy is taken with `git ls-files` (tracked and untracked, not ignored) from the
repository root, plus the built extensions, so Python mutants run without a build; the C++ mutants rebuild the
extensions that link the Kunlun3 plugin in the copy (setup.py's `build_ext --inplace` of those two: a full build of
the plugin the first time, incremental afterwards; the CPU ops' extension, which no mutant touches, is the copied
one).

A mutant is "caught" when its targeted tests fail (pytest exit status 1) and "missed" when they pass. Before
any mutant the targeted tests must pass on the unmodified copy. Exit status: 0 if every mutant is caught, 1 if
one is missed, 2 on a setup error (a snippet not found, a failing baseline, a build error, a collection error).

    python scripts/check_seed_mutants.py [--only NAME ...] [--keep]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTENSIONS = ("_paddle_ops", "_kl3_pybind", "_cpu_linear")
PER_RUN_TIMEOUT_S = 900   # a targeted run that exceeds this counts as a setup error, never as a pass


@dataclass(frozen=True, slots=True)
class Mutant:
    name: str
    defect: str                      # what the pre-fix code did (PD_MTP_FLOW §8)
    path: str                        # file the patch applies to, relative to the repository root
    old: str
    new: str
    tests: tuple[str, ...]           # pytest arguments selecting the targeted tests, cheapest first (run with -x:
                                     # the first failure ends the run, before the MoE checkpoint's fixtures)

    @property
    def native(self) -> bool:
        return not self.path.endswith(".py")


SEED_FIXES = "tests/pd/test_seed_fixes.py"
# the same scenarios on an ERNIE-4.5 MoE checkpoint with its own MTP module (skipped without the torch reference);
# first, so that -x stops on it when it catches the mutant (it is what shows the fix holds on a real architecture)
MOE_MTP = "tests/models/test_ernie4_5_moe_mtp.py"
MOE_SCENARIOS = f"{MOE_MTP}::test_pd_seed_scenarios_on_the_moe_checkpoint"
MOE_TOKEN_0 = f"{MOE_MTP}::test_token_id_0_ending_d_first_round_is_processed"
FIX2_SEED_TEST = f"{SEED_FIXES}::test_fix2_eos_in_d_first_round_is_released_in_the_same_step"
UPDATE_WRAPPER = "custom_ops/xpu_ops/src/plugin/src/wrapper/mtp_wrapper/speculate_update.cpp"
UPDATE_KERNEL = "custom_ops/xpu_ops/src/plugin/src/kernel/kunlun3cpp/mtp_kernel/speculate_update.xpu"
RUNNER = "fastdeploy/worker/model_runner_base.py"

MUTANTS = (
    Mutant("fix1_token_processor_skips_last_token_le_0",
           "the token processor skips a slot whose last token is <= 0 instead of only a count of 0",
           "fastdeploy/output/token_processor.py",
           "            else:\n                tokens = tuple(entry)",
           "            elif entry[-1] > 0:\n                tokens = tuple(entry)",
           (f"{SEED_FIXES}::test_fix1_a_count_of_one_is_processed_whatever_the_token_value",
            "tests/engine/test_token_processor.py", MOE_TOKEN_0)),
    Mutant("fix2_cpu_path_update_row_c_omitted",
           "speculate_update's C++ CPU path does not add accept_num for a slot verify just stopped",
           UPDATE_WRAPPER,
           "      new_dec = dec + n;\n      mask_rollback[b] = 0;\n      ++stopped;",
           "      mask_rollback[b] = 0;\n      ++stopped;",
           ("tests/ops/test_speculate_update.py", FIX2_SEED_TEST, MOE_SCENARIOS, "-m", "not emulator")),
    Mutant("fix2_kernel_update_row_c_omitted",
           "speculate_update's Kunlun3 kernel does not add accept_num for a slot verify just stopped",
           UPDATE_KERNEL,
           "    if (stop_sm[b] != 0) {  // row C\n      dec_sm[b] += n;\n",
           "    if (stop_sm[b] != 0) {  // row C\n",
           ("tests/ops/test_speculate_update.py", FIX2_SEED_TEST, MOE_SCENARIOS, "-m", "emulator")),
    Mutant("fix3_d_first_round_one_position",
           "D's first round feeds one position (seq_lens_this_time = 1), so d1 is never verified",
           RUNNER,
           "        width = min(len(task.draft_token_ids), self.k + 1)\n",
           "        width = 1\n",
           (f"{SEED_FIXES}::test_fix3_d_first_round_covers_two_positions", "tests/engine/test_decode_insertion.py",
            MOE_SCENARIOS)),
    Mutant("fix4_d_first_round_stale_drafts",
           "D's insertion leaves draft_tokens[b] as the slot's previous occupant left it",
           RUNNER,
           "        s.draft_tokens[b] = -1\n        s.draft_tokens[b, :width] = task.draft_token_ids[:width]\n",
           "",
           (f"{SEED_FIXES}::test_fix4_d_first_round_drafts_come_from_the_request",
            "tests/engine/test_decode_insertion.py", MOE_SCENARIOS)),
)


class SetupError(RuntimeError):
    pass


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked, not ignored) plus the built extensions."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        source = ROOT / rel
        if source.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)
    ops_dir = ROOT / "fastdeploy" / "model_executor" / "ops"
    built = [p for p in ops_dir.iterdir() if p.name.startswith(EXTENSIONS) and p.suffix == ".so"]
    if len(built) < len(EXTENSIONS):
        raise SetupError(f"the extensions are not built in {ops_dir}: run `python setup.py build_ext --inplace`")
    for so in built:
        shutil.copy2(so, dest / so.relative_to(ROOT))


def patch(tree: Path, path: str, old: str, new: str, name: str) -> None:
    target = tree / path
    text = target.read_text()
    count = text.count(old)
    if count != 1:
        raise SetupError(f"mutant {name}: the snippet to replace occurs {count} times in {path} (expected once); "
                         f"update the mutant to the current code")
    target.write_text(text.replace(old, new))


# setup.py's extensions that link the Kunlun3 plugin, the only sources the native mutants patch, built without
# the CPU ops' (the copied _cpu_linear stays: its AVX-512 unit is most of a full build's minutes)
BUILD_PLUGIN_EXTENSIONS = """
import importlib.util, sys
from setuptools import setup
spec = importlib.util.spec_from_file_location("fd_setup", "setup.py")
fd_setup = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fd_setup)
sys.argv = ["setup.py", "build_ext", "--inplace"]
setup(ext_modules=[e for e in fd_setup.EXTENSIONS if e.name in fd_setup.PLUGIN_EXTENSIONS],
      cmdclass={"build_ext": fd_setup.BuildNativeOps})
"""


def build(tree: Path, log: Path) -> float:
    start = time.monotonic()
    with log.open("a") as out:
        done = subprocess.run([sys.executable, "-c", BUILD_PLUGIN_EXTENSIONS], cwd=tree, stdout=out,
                              stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SetupError(f"build failed in {tree} (log {log})")
    return time.monotonic() - start


def run_tests(tree: Path, args: tuple[str, ...], log: Path) -> int:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args]
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        try:
            return subprocess.run(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=PER_RUN_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            raise SetupError(f"targeted tests ran past {PER_RUN_TIMEOUT_S} s (log {log})") from None


def baseline_args(mutants: list[Mutant]) -> tuple[str, ...]:
    """Every mutant's targeted tests in one pytest run: the test paths, once each, and no -m filter (a superset)."""
    selected: list[str] = []
    for mutant in mutants:
        args = iter(mutant.tests)
        for arg in args:
            if arg == "-m":
                next(args)
            elif arg not in selected:
                selected.append(arg)
    return tuple(selected)


def check(mutants: list[Mutant], tree: Path, log: Path) -> list[tuple[Mutant, str, float]]:
    print(f"baseline: targeted tests on the unmodified copy ({tree})", flush=True)
    if run_tests(tree, baseline_args(mutants), log) != 0:
        raise SetupError(f"baseline: the mutants' targeted tests fail without a mutant (log {log})")
    # Python mutants first: a native mutant's source is restored after its run but its build stays in the copy, so
    # each native one must come after every mutant that does not rebuild (the next native build takes the restore)
    mutants = sorted(mutants, key=lambda m: m.native)
    results = []
    for i, mutant in enumerate(mutants, 1):
        print(f"[{i}/{len(mutants)}] {mutant.name}: {mutant.defect}", flush=True)
        start = time.monotonic()
        original = (tree / mutant.path).read_text()
        patch(tree, mutant.path, mutant.old, mutant.new, mutant.name)
        try:
            if mutant.native:
                print(f"    rebuilding the extensions ({build(tree, log):.0f} s)", flush=True)
            status = run_tests(tree, mutant.tests, log)
        finally:
            (tree / mutant.path).write_text(original)
        if status not in (0, 1):
            raise SetupError(f"mutant {mutant.name}: pytest exit status {status} (log {log})")
        verdict = "caught" if status == 1 else "MISSED"
        results.append((mutant, verdict, time.monotonic() - start))
        print(f"    {verdict} ({results[-1][2]:.0f} s)", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=[m.name for m in MUTANTS],
                        help="check only these mutants")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    args = parser.parse_args(argv)
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    scratch = Path(tempfile.mkdtemp(prefix="seed-mutants-"))
    tree, log = scratch / "tree", scratch / "log.txt"
    try:
        copy_tree(tree)
        results = check(mutants, tree, log)
    except SetupError as error:
        print(f"error: {error}", file=sys.stderr)
        args.keep = True
        return 2
    finally:
        if args.keep:
            print(f"scratch copy and log kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    width = max(len(m.name) for m, _, _ in results)
    print(f"\n{'mutant':<{width}}  verdict  seconds")
    for mutant, verdict, seconds in results:
        print(f"{mutant.name:<{width}}  {verdict:<7}  {seconds:7.0f}")
    missed = [m.name for m, verdict, _ in results if verdict != "caught"]
    print(f"\n{len(results) - len(missed)} of {len(results)} seed mutants caught"
          + (f"; missed: {', '.join(missed)}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
