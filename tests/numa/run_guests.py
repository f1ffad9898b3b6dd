#!/usr/bin/python3
"""Runs tests/numa/guest_checks.py inside a QEMU guest of each topology
(tests/numa/guest.py boots them) and prints a summary per topology.

  tests/numa/run_guests.py [--build-dir build/release] [--short]
                           [--topologies NAME,NAME] [--timeout S]

make test-numa runs every topology with every check (~5 minutes each under
TCG on 2 cores); --short runs topology two-packages-memory-node with the
short checks only (plan, serve, infer, page placement), which is ctest's
numa.guest_short. Exits 0 when every topology passed.
"""

import argparse
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import guest  # noqa: E402
import topologies  # noqa: E402

SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
CHECKS = os.path.join(HERE, "guest_checks.py")


class Outcome:
    def __init__(self, name, status, seconds, console):
        self.name, self.status, self.seconds = name, status, seconds
        ran = re.findall(r"^Ran (\d+) tests? in", console, re.M)
        self.tests = int(ran[-1]) if ran else 0
        self.failed = re.findall(r"^(?:FAIL|ERROR): (\S+) \(", console, re.M)
        self.expected = re.findall(r"^(\S+) \(.*\) \.\.\. expected failure", console, re.M)
        results = re.findall(r"^(OK|FAILED)( \(.*\))?$", console, re.M)
        self.result = "".join(results[-1]) if results else None

    def line(self):
        if self.status == 0:
            verdict = "passed"
        elif self.status == guest.EXIT_HUNG:
            verdict = "HUNG (killed)"
        elif self.status in (guest.EXIT_NO_STATUS, guest.EXIT_CANNOT_BOOT):
            verdict = "DID NOT RUN (exit %d)" % self.status
        else:
            verdict = "FAILED (exit %d)" % self.status
        text = "%-26s %-22s %3d checks, %4.0f s  %s" % (self.name, verdict, self.tests,
                                                       self.seconds, self.result or "")
        for name in self.failed:
            text += "\n    failed: %s" % name
        for name in self.expected:
            text += "\n    expected failure: %s" % name
        return text


def run_topology(name, args):
    checks = "short" if args.short else "full"
    binary = os.path.join(os.path.abspath(args.build_dir), "bin", "numaserve")
    env = ["NUMA_GUEST_CHECKS=" + checks, "NUMASERVE_BIN=" + binary,
           "NUMASERVE_SOURCE_DIR=" + SOURCE_DIR, "PYTHONDONTWRITEBYTECODE=1",
           "GRPC_ENABLE_FORK_SUPPORT=false"]
    if os.environ.get("CI"):
        env.append("CI=" + os.environ["CI"])
    guest_args = argparse.Namespace(
        topology=name, build_dir=args.build_dir, timeout=args.timeout, accel=args.accel,
        env=env, quiet=False, command=["/usr/bin/python3", CHECKS, "-v"])
    started = time.monotonic()
    status = guest.run_guest(guest_args)
    seconds = time.monotonic() - started
    console_path = os.path.join(os.path.abspath(args.build_dir), "numa-guest", "runs", name,
                                "console.log")
    console = ""
    if os.path.isfile(console_path):
        with open(console_path, errors="replace") as f:
            console = f.read()
    return Outcome(name, status, seconds, console)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default="build/release")
    parser.add_argument("--short", action="store_true",
                        help="topology %s, the short checks (ctest numa.guest_short)"
                        % topologies.SHORT_TOPOLOGY)
    parser.add_argument("--topologies", default="",
                        help="comma-separated names (default: all; --short: %s)"
                        % topologies.SHORT_TOPOLOGY)
    parser.add_argument("--timeout", type=int, default=900,
                        help="seconds before a guest counts as hung (default 900)")
    parser.add_argument("--accel", choices=("tcg", "kvm"),
                        default=os.environ.get("NUMA_GUEST_ACCEL", "tcg"))
    args = parser.parse_args()
    names = [n for n in args.topologies.split(",") if n]
    if not names:
        names = [topologies.SHORT_TOPOLOGY] if args.short else sorted(topologies.TOPOLOGIES)
    unknown = [n for n in names if n not in topologies.TOPOLOGIES]
    if unknown:
        parser.error("unknown topologies %s (known: %s)"
                     % (", ".join(unknown), ", ".join(sorted(topologies.TOPOLOGIES))))
    args.build_dir = os.path.abspath(args.build_dir)
    os.chdir(SOURCE_DIR)  # the guest runs the checks from the source tree
    started = time.monotonic()
    outcomes = [run_topology(name, args) for name in names]
    print("\nnuma guests (%s checks, %.0f s in all; run folders in %s):"
          % ("short" if args.short else "full", time.monotonic() - started,
             os.path.join(args.build_dir, "numa-guest", "runs")))
    for outcome in outcomes:
        print("  " + outcome.line().replace("\n", "\n  "))
    return 0 if all(o.status == 0 for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
