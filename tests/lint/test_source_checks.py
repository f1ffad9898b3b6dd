#!/usr/bin/env python3
"""tools/source_checks.py, the part of `make format-check` beyond clang-format,
run on small git trees made here: files over 800 lines are named, and so
are headers that .clang-tidy's header filters leave out of `make tidy`.

usage: test_source_checks.py [-v]   (NUMASERVE_SOURCE_DIR: the source tree)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = os.path.abspath(os.environ.get("NUMASERVE_SOURCE_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(SOURCE_DIR, "tools", "source_checks.py")
PYTHON = sys.executable

# The header filter .clang-tidy had before it named nested folders: it
# selected base/log.h but not engine/compiler/*.h, kernels/cpu/*.h,
# training/*.h or any .inc.
OLD_FILTER = ("HeaderFilterRegex: '^.*/(affinity|base|engine|kernels|serving/[a-z]+|"
              "tools/numaserve)/[^/]*\\.h$'\n")

# One header in each folder make tidy analyses, nested as the tree nests them.
PROJECT_HEADERS = ("affinity/topology.h", "base/log.h", "engine/model.h",
                   "engine/compiler/compiled_steps.h", "kernels/cpu/attention_simd.inc",
                   "kernels/gemm/gemm.h", "serving/workers/worker.h", "training/trainer.h",
                   "tools/numaserve/commands.h")


def lines(n):
    return "".join("// line %d\n" % i for i in range(n))


class SourceChecksTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="source_checks_")
        self.root = os.path.join(self.tmp, "numaserve")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def tree(self, files, clang_tidy=None, root=None):
        """A git tree at ROOT (default self.root) with FILES {path: text}
        added to its index and .clang-tidy (default: the project's)."""
        root = root or self.root
        os.makedirs(root)
        if clang_tidy is None:
            with open(os.path.join(SOURCE_DIR, ".clang-tidy")) as f:
                clang_tidy = f.read()
        files = dict(files, **{".clang-tidy": clang_tidy})
        for path, text in files.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        subprocess.run(["git", "init", "-q", root], check=True)
        subprocess.run(["git", "-C", root, "add", "--"] + sorted(files), check=True)
        return root

    def check(self, root=None):
        result = subprocess.run([PYTHON, SCRIPT, root or self.root], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=60)
        return result.returncode, result.stdout

    def named(self, output):
        return sorted(line.split(": ")[1] for line in output.splitlines()
                      if line.startswith("source-checks: ") and ": " in line[15:]
                      and not line.endswith("problem(s)"))

    def test_files_over_800_lines_are_named(self):
        self.tree({
            "engine/big.cc": lines(801),
            "engine/limit.h": lines(800),
            "kernels/cpu/big.inc": lines(801),
            "tests/clients/big_client.py": lines(801),
            "deploy/big.sh": lines(801),
            ".ci/run": "#!/usr/bin/env bash\n" + lines(800),
            "docs/long.md": lines(2000),
            "tests/data/long.txt": lines(2000),
            "no_newline.cc": lines(800) + "int x;",
        })
        code, out = self.check()
        self.assertEqual(code, 1, out)
        self.assertEqual(self.named(out), [
            ".ci/run", "deploy/big.sh", "engine/big.cc", "kernels/cpu/big.inc", "no_newline.cc",
            "tests/clients/big_client.py"], out)
        self.assertIn("801 lines, over the limit of 800", out)

    def test_the_project_filter_selects_every_nested_header(self):
        self.tree({path: "#pragma once\n" for path in PROJECT_HEADERS})
        code, out = self.check()
        self.assertEqual(code, 0, out)
        self.assertIn("source-checks: clean", out)

    def test_the_old_filter_missed_nested_headers_and_inc_files(self):
        self.tree({path: "#pragma once\n" for path in PROJECT_HEADERS}, clang_tidy=OLD_FILTER)
        code, out = self.check()
        self.assertEqual(code, 1, out)
        self.assertEqual(self.named(out), [
            "engine/compiler/compiled_steps.h", "kernels/cpu/attention_simd.inc",
            "kernels/gemm/gemm.h", "training/trainer.h"], out)

    def test_a_header_in_a_new_folder_is_named(self):
        self.tree({"base/log.h": "", "scheduler/queue.h": "", "tests/engine/helper.h": "",
                   "benchmarks/bench.h": ""})
        code, out = self.check()
        self.assertEqual(code, 1, out)
        self.assertEqual(self.named(out), ["scheduler/queue.h"], out)

    def test_generated_protobuf_headers_stay_out_wherever_the_tree_is(self):
        # A tree inside a folder named like a source folder: the header
        # filter alone would select its build tree's generated headers too.
        root = os.path.join(self.tmp, "base", "numaserve")
        self.tree({"base/log.h": ""}, root=root)
        code, out = self.check(root)
        self.assertEqual(code, 0, out)
        shutil.rmtree(root)
        with open(os.path.join(SOURCE_DIR, ".clang-tidy")) as f:
            without_exclude = "".join(line for line in f
                                      if not line.startswith("ExcludeHeaderFilterRegex"))
        self.tree({"base/log.h": ""}, clang_tidy=without_exclude, root=root)
        code, out = self.check(root)
        self.assertEqual(code, 1, out)
        self.assertIn("build/release/proto/grpc_service.pb.h (generated)", out)

    def test_an_unreadable_filter_is_a_failure(self):
        self.tree({"base/log.h": ""}, clang_tidy="HeaderFilterRegex: '(unclosed'\n")
        code, out = self.check()
        self.assertEqual(code, 1, out)
        self.assertIn("cannot read its header filters", out)


if __name__ == "__main__":
    unittest.main()
