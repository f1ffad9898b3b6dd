"""What a test does when something it needs is missing.

A test that cannot run for want of a prerequisite (a Debian package, a
generated file, a tool) says so with the reason and shows as skipped in
ctest (every Python test carries SKIP_REGULAR_EXPRESSION, see
tests/CMakeLists.txt). Under CI=true, where deploy/install-deps.sh has run
and every prerequisite must be there, the same test fails instead: a skip
must never let a CI run pass having checked less than it says.

Skips for what the machine lacks (no AVX-512, no native BF16) are not
missing prerequisites: tests call unittest's skipTest for those.
"""

import os


def in_ci():
    return os.environ.get("CI", "").lower() == "true"


def missing(test, reason):
    """Skips test naming reason, or fails it under CI=true."""
    if in_ci():
        test.fail("missing prerequisite (CI=true, so this fails instead of skipping): " + reason)
    test.skipTest(reason)
