"""Does the fast test tier catch a broken engine? Breaks it on purpose, one defect at a time, through
the native engine's test-only switch (PYDFLASH2_MUTATION, native/src/engine/mutation.h: off unless the
variable names a defect), runs fast-tier tests under each, and prints which tests failed. Every
defect must fail at least one test; the script exits 1 when one survives (or when the tests fail
without any defect).

    python benchmarks/mutation_check.py                 # the lossless and sampling files, stop at the first failure
    python benchmarks/mutation_check.py --all           # the whole fast tier, every failure
    python benchmarks/mutation_check.py --only skip_grammar,q_for_p

Run it from the repository root with the venv that has pydflash2 installed (the switch is in the
installed native library, so reinstall after changing native code).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTATIONS = {
    "skip_penalties": "the penalty sampler left out of the chain",
    "skip_grammar": "the grammar left out of the chain",
    "accept_extra_draft": "a chain verify keeps the first rejected draft too",
    "wrong_tree_branch": "a tree verify follows another child than the target chose",
    "q_for_p": "rejection sampling reads the drafter's q where the target's p belongs",
}
# fast-tier files that hold the lossless, sampling-law and sampler-chain claims
FILES = ["tests/test_sampling_law.py", "tests/test_speculator.py", "tests/test_server_api.py",
         "tests/test_tree_verify.py", "tests/test_exact.py", "tests/test_any_arch.py"]


def run_tests(mutation: str | None, files: list[str], first_only: bool, basetemp: Path) -> tuple[int, list[str], float]:
    env = {k: v for k, v in os.environ.items() if k != "PYDFLASH2_MUTATION"}
    if mutation:
        env["PYDFLASH2_MUTATION"] = mutation
    cmd = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "--basetemp", str(basetemp),
           *(["-x"] if first_only else []), *files]
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", r.stdout, re.M)))
    return r.returncode, failed, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="the whole fast tier, and every failure (not just the first)")
    ap.add_argument("--only", default="", help="comma list of defects (default: all)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run without a defect")
    args = ap.parse_args(argv)
    files = [] if args.all else [f for f in FILES if (ROOT / f).exists()]
    names = [m for m in args.only.split(",") if m] or list(MUTATIONS)
    unknown = sorted(set(names) - set(MUTATIONS))
    if unknown:
        ap.error(f"unknown defects {unknown}; known: {sorted(MUTATIONS)}")
    tmp = ROOT / "bench_out" / "mutation_check"
    ok = True
    if not args.no_baseline:
        rc, failed, dt = run_tests(None, files, False, tmp / "baseline")
        print(f"{'no defect':<20} rc {rc}, {len(failed)} failed, {dt:.0f} s" + (f": {failed}" if failed else ""))
        ok &= rc == 0
    for name in names:
        rc, failed, dt = run_tests(name, files, not args.all, tmp / name)
        caught = rc != 0 and bool(failed)
        ok &= caught
        verdict = "CAUGHT by " + ", ".join(failed) if caught else f"SURVIVED (rc {rc})"
        print(f"{name:<20} {MUTATIONS[name]}: {verdict} ({dt:.0f} s)", flush=True)
    print("every defect was caught" if ok else "some defect survived (or the baseline failed)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
