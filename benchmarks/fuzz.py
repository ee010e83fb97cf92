"""A fuzzing campaign against a running coordinator, with its counts.

Runs the suite's fuzz tests (``tests/integration/test_fuzz.py``) with random, not
derandomized, draws and ``--examples`` examples per campaign, and prints what they
did as JSON: messages tried, refusals, accepted hostile uploads, rounds committed.
A crash or a corrupted round fails the tests, and then this exits non-zero.

Run as ``python -m benchmarks.fuzz --examples 2000``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["main", "run_campaign"]

TESTS = Path(__file__).resolve().parent.parent / "tests" / "integration" / "test_fuzz.py"


def run_campaign(examples: int, timeout_s: float) -> tuple[int, list[dict[str, object]]]:
    """The tests' exit status and one report per campaign."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "fuzz.jsonl"
        env = {
            **os.environ,
            "GEOFL_FUZZ_EXAMPLES": str(examples),
            "GEOFL_FUZZ_REPORT": str(report),
        }
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS)]
        command += ["-o", f"timeout={int(timeout_s)}"]
        status = subprocess.run(command, env=env, check=False).returncode
        lines = report.read_text().splitlines() if report.exists() else []
    return status, [json.loads(line) for line in lines]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1000, help="examples per campaign")
    parser.add_argument("--timeout-s", type=float, default=3600)
    args = parser.parse_args(argv)
    status, reports = run_campaign(args.examples, args.timeout_s)
    summary = {
        "examples_per_campaign": args.examples,
        "messages": sum(int(str(r["messages"])) for r in reports),
        "tests_passed": status == 0,
        "campaigns": reports,
    }
    print(json.dumps(summary, indent=2))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
