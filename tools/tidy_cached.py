#!/usr/bin/env python3
"""clang-tidy over source files, skipping those it already found clean.

    tools/tidy_cached.py -p BUILD_DIR [-j N] [--cache DIR] [--extra-arg A ...] FILE...

A file's result depends on clang-tidy, its configuration, the file's compile
command and everything the file includes. So a clean result is remembered
under a hash of: `clang-tidy --version`, every .clang-tidy from the file's
folder up to the source root, the extra arguments, the compile command (the
output path and the source root left out) and the file's preprocessed text
(`-E -P` with its own command, the source root left out, so that a clone in
another folder finds the same hashes). A file whose hash was found clean is
not checked again; any other file is, and its findings are printed as
clang-tidy prints them. Findings are never remembered.

The cache (default ${XDG_CACHE_HOME:-~/.cache}/numaserve/tidy) holds one
empty file per clean hash; deleting it costs only time. Exits 1 when a file
has findings, 2 when a file has no compile command.
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compile_commands(build_dir):
    """{absolute source path: argument list} from compile_commands.json."""
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        entries = json.load(f)
    commands = {}
    for e in entries:
        path = os.path.normpath(os.path.join(e["directory"], e["file"]))
        args = e.get("arguments") or shlex.split(e["command"])
        commands[path] = (e["directory"], args)
    return commands


def preprocess_args(args):
    """The compile command, to preprocess: -o and its path dropped, -E -P added."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a.startswith("-o") and len(a) > 2:
            continue
        out.append(a)
    return out[:1] + ["-E", "-P"] + out[1:]


def configs_above(path):
    """The text of every .clang-tidy from path's folder up to the source root."""
    texts = []
    folder = os.path.dirname(path)
    while True:
        config = os.path.join(folder, ".clang-tidy")
        if os.path.exists(config):
            with open(config, "rb") as f:
                texts.append(f.read())
        if folder == ROOT or os.path.dirname(folder) == folder:
            return texts
        folder = os.path.dirname(folder)


def file_hash(path, directory, args, version, extra):
    """The hash of what decides clang-tidy's result on `path`, or None."""
    command = preprocess_args(args)
    result = subprocess.run(command, cwd=directory, capture_output=True)
    if result.returncode != 0:
        return None
    h = hashlib.sha256()
    h.update(version)
    for text in configs_above(path):
        h.update(text)
    h.update("\0".join(extra).encode())
    h.update("\0".join(command).replace(ROOT, "<root>").encode())
    h.update(result.stdout.replace(ROOT.encode(), b"<root>"))
    return h.hexdigest()


def check(path, commands, build_dir, cache, version, extra):
    """(path, clean, output, cached)."""
    directory, args = commands[path]
    key = file_hash(path, directory, args, version, extra)
    marker = os.path.join(cache, key) if key else None
    if marker and os.path.exists(marker):
        return path, True, "", True
    tidy = ["clang-tidy-19", "-p", build_dir, "--quiet"] + ["-extra-arg=" + a for a in extra]
    result = subprocess.run(tidy + [path], capture_output=True, text=True)
    output = result.stdout + result.stderr
    clean = result.returncode == 0 and "warning:" not in output and "error:" not in output
    if clean and marker:
        with open(marker, "w"):
            pass
    return path, clean, output, False


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-p", dest="build_dir", required=True)
    parser.add_argument("-j", dest="jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cache", default=os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "numaserve", "tidy"))
    parser.add_argument("--extra-arg", action="append", default=[])
    parser.add_argument("files", nargs="+")
    o = parser.parse_args()
    os.makedirs(o.cache, exist_ok=True)
    commands = compile_commands(o.build_dir)
    files = [os.path.normpath(os.path.abspath(f)) for f in o.files]
    missing = [f for f in files if f not in commands]
    if missing:
        print("tidy: no compile command for: " + " ".join(missing), file=sys.stderr)
        return 2
    version = subprocess.run(["clang-tidy-19", "--version"], capture_output=True).stdout
    failed, cached = [], 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, o.jobs)) as pool:
        jobs = [pool.submit(check, f, commands, o.build_dir, o.cache, version, o.extra_arg)
                for f in files]
        for job in concurrent.futures.as_completed(jobs):
            path, clean, output, was_cached = job.result()
            cached += was_cached
            if not clean:
                failed.append(path)
                print(output, end="" if output.endswith("\n") else "\n")
    print("tidy: %d files, %d found clean before, %d checked, %d with findings"
          % (len(files), cached, len(files) - cached, len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
