#!/usr/bin/python3
"""ctest numa.guest_short: numaserve in a QEMU guest with three NUMA nodes
(two packages and a memory-only node), the short checks of
tests/numa/guest_checks.py: the plan of `numaserve topology`, a served
model's workers bound to their nodes (cpus, memory policy, >= 95% of their
pages on their node), requests answered by every worker. About 3 minutes
under TCG on 2 cores. `make test-numa` runs every topology and check.

Without QEMU, a kernel image or a static busybox (deploy/install-deps.sh
installs qemu-system-x86, linux-image-amd64 and busybox-static) this is a
missing prerequisite: a skip, a failure under CI=true.
"""

import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "clients"))
import guest  # noqa: E402
import prerequisites  # noqa: E402


class GuestShortTest(unittest.TestCase):

    def test_short_checks_in_a_three_node_guest(self):
        missing = guest.missing_prerequisites()
        if missing:
            prerequisites.missing(self, "cannot boot a NUMA guest: " + "; ".join(missing))
        binary = os.environ.get("NUMASERVE_BIN", "")
        build_dir = os.path.dirname(os.path.dirname(binary)) if binary else "build/release"
        result = subprocess.run([sys.executable, os.path.join(HERE, "run_guests.py"), "--short",
                                 "--build-dir", build_dir, "--timeout", "480"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=570)
        # The guest's console, for the ctest log (its unittest lines included).
        print(result.stdout)
        self.assertEqual(result.returncode, 0, "the short NUMA guest checks failed; the "
                         "summary:\n" + result.stdout[-3000:])


if __name__ == "__main__":
    unittest.main()
