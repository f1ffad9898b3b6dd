#!/usr/bin/env bash
# Makes (or reuses) the virtual environment <build>/venv/NAME from
# requirements/NAME.txt and prints its python's path.
#
#   tools/python/venv.sh BUILD_DIR NAME
#
# The environment is made from Debian's /usr/bin/python3 (NUMASERVE_PYTHON),
# isolated from Debian's python3-* packages (unless the requirements file
# has the line `# venv: system-site-packages`: then it sees them, under its
# own wheels; requirements/zoo.txt says why it needs Debian's PyTorch), and
# filled with exactly the requirements file's wheels: pip --require-hashes (every version pinned,
# every wheel's sha256 checked), --no-deps (the file lists the whole
# closure), --only-binary (nothing built here). Idempotent: a stamp holds
# the requirements file's sha256, and a changed file makes the environment
# again.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: tools/python/venv.sh BUILD_DIR NAME" >&2
  exit 2
fi
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$1
name=$2
requirements="$src/requirements/$name.txt"
if [ ! -f "$requirements" ]; then
  echo "venv: no requirements file $requirements" >&2
  exit 2
fi
python=${NUMASERVE_PYTHON:-/usr/bin/python3}
venv="$build/venv/$name"
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.requirements-sha256" 2>/dev/null)" = "$want" ]; then
  echo "$venv/bin/python"
  exit 0
fi
venv_args=()
if grep -qx '# venv: system-site-packages' "$requirements"; then
  venv_args+=(--system-site-packages)
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "${venv_args[@]}" "$venv" >&2
# The index and certificates come from pip's own configuration; a
# machine's constraints file or local wheel folder (PIP_CONSTRAINT,
# PIP_FIND_LINKS) is for other packages than these: not read.
PIP_CONSTRAINT="" PIP_FIND_LINKS="" "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-deps --require-hashes --only-binary=:all: -r "$requirements" >&2 ||
  { echo "venv: installing $requirements into $venv failed" >&2; rm -rf "$venv"; exit 1; }
echo "$want" >"$venv/.requirements-sha256"
echo "$venv/bin/python"
