#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of numaserve from
# Debian 13 (trixie)'s packages, the compilers and build tools included.
# Idempotent: quiet and quick when everything is present. On an older
# Debian, deploy/debian13-root.sh runs the same commands in a Debian 13 root.
set -euo pipefail

version_id=$(. /etc/os-release && echo "${VERSION_ID:-unknown}")
if ! [ "${version_id%%.*}" -ge 13 ] 2>/dev/null; then
  echo "install-deps: numaserve targets Debian 13 (trixie); this machine runs" \
    "$(. /etc/os-release && echo "${PRETTY_NAME:-an unknown system}")." >&2
  echo "install-deps: run the same command in a Debian 13 root instead:" \
    "deploy/debian13-root.sh make TARGET (make test, make serve, ...)" >&2
  exit 1
fi

packages=(
  build-essential cmake ninja-build pkg-config git clang-format clang-tidy ccache
  libdnnl-dev libopenblas-openmp-dev libblis-openmp-dev libhwloc-dev hwloc
  libabsl-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus-cpp-dev libonnx-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-grpcio python3-grpc-tools python3-onnx python3-numpy python3-protobuf
  prometheus curl dataset-fashion-mnist libonnx-testdata
  openssl libssl-dev
  # the HTTP/REST front end: libevent's evhttp (with its OpenSSL and pthreads
  # parts) and RapidJSON (header-only)
  libevent-dev rapidjson-dev
  # sd_notify readiness and watchdog (systemd Type=notify); the deploy tests
  # (systemd-analyze, python3-yaml for the Kubernetes manifests, shellcheck)
  libsystemd-dev systemd python3-yaml shellcheck
  # make fuzz (libFuzzer and its sanitizer runtimes, clang's OpenMP) and
  # symbolized sanitizer reports (llvm-symbolizer) for make test-asan/-tsan
  clang libclang-rt-dev libomp-dev llvm
  # make report's plots (benchmarks/report/make_report.py, matplotlib's Agg
  # backend: no display needed)
  python3-matplotlib
  # the virtual environments of pinned PyPI packages (requirements/)
  python3-venv
  # the model zoo (benchmarks/models/zoo.py, ctest models.zoo): PyTorch (CPU)
  # and torchvision, which export the models; requirements/zoo.txt adds
  # transformers and ONNX Runtime from PyPI. ~40 s and ~0.9 GB to install
  python3-torch python3-torchvision
  # the QEMU guests with several NUMA nodes (tests/numa: make test-numa, and
  # ctest's numa.guest_short): QEMU, a kernel to boot, busybox for the
  # guest's initramfs. ~40 s to install (a kernel's postinst included)
  qemu-system-x86 linux-image-amd64 busybox-static
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
