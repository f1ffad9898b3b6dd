#!/usr/bin/python3
"""Runs a command inside a QEMU guest with several NUMA nodes.

  tests/numa/guest.py --topology NAME [--build-dir DIR] [--timeout S]
                      [--accel tcg|kvm] [--env NAME=VALUE]... -- COMMAND [ARG...]
  tests/numa/guest.py --list          the topologies (tests/numa/topologies.py)
  tests/numa/guest.py --prerequisites what is missing to boot a guest, if anything

The guest boots the kernel of this system (/boot/vmlinuz-*, Debian's
linux-image-amd64) from a small initramfs made here from busybox-static and
the kernel's 9p modules, with the topology's sockets, cores and NUMA nodes.
This system's root file system is shared into it read-only over virtio-9p,
so the guest runs the same build tree, Python and libraries; a writable
folder of the build tree (the run's folder) is shared at its own path. The
guest mounts /proc, /sys, /dev, tmpfs on /tmp, /run and /dev/shm, brings up
`lo`, sets a hostname (Open MPI needs one), runs COMMAND chrooted into the
shared root from the current folder, and powers off. COMMAND's output comes
back on the serial console (printed here as it arrives, and kept in the
run folder's console.log); this script exits with COMMAND's exit status.

The run folder, <build>/numa-guest/runs/<topology>, holds topology.json
(the topology the guest was given, for the checks inside to compare with)
and whatever COMMAND writes to $NUMA_GUEST_OUT.

A guest that does not finish within --timeout seconds is killed: exit 124,
with the console's last lines. A guest that stops without reporting
COMMAND's status (a kernel panic, an initramfs error): exit 125.

Acceleration: TCG emulation by default: slow (minutes per topology on 2
cores), and for behaviour only: TCG's `-cpu max` has AVX2 but not AVX-512.
--accel kvm (or NUMA_GUEST_ACCEL=kvm) asks for KVM where it works; a
/dev/kvm that opens is no proof of that (a nested hypervisor that cannot
emulate VEX instructions stops the guest with "KVM internal error", which
ends the run at once).
"""

import argparse
import glob
import gzip
import hashlib
import json
import lzma
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import topologies  # noqa: E402

QEMU = "qemu-system-x86_64"
BUSYBOX_CANDIDATES = ("/usr/bin/busybox", "/bin/busybox")
# The 9p modules and the virtio transport they ride on (built in on Debian).
GUEST_MODULES = ("virtio_pci", "9pnet_virtio", "9p")
EXIT_MARKER = "numa-guest: exit status "
EXIT_HUNG = 124
EXIT_NO_STATUS = 125
EXIT_CANNOT_BOOT = 126
# Characters allowed in the paths handed to QEMU's options and the kernel's
# command line (QEMU splits options on commas, the kernel on spaces).
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")

# PID 1 of the guest (busybox sh). Mounts the shares, runs the command
# chrooted, reports its status on the console and in the run folder.
INIT_SCRIPT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /bin /proc /sys /dev /root
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
fail() { echo "numa-guest: init: $*"; poweroff -f; sleep 5; }
out=$(sed -n 's/.*numaserve\.out=\([^ ]*\).*/\1/p' /proc/cmdline)
[ -n "$out" ] || fail "no numaserve.out= on the kernel command line"
while read -r module; do
  insmod "/lib/modules/$module.ko" || fail "insmod $module failed"
done </lib/modules/load-order
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=524288 root /root ||
  fail "cannot mount the root share"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 out "/root$out" ||
  fail "cannot mount the run folder at $out"
mount -t proc proc /root/proc
mount -t sysfs sysfs /root/sys
mount -t devtmpfs devtmpfs /root/dev
mkdir -p /root/dev/shm /root/dev/pts
mount -t tmpfs -o mode=1777 shm /root/dev/shm
mount -t devpts devpts /root/dev/pts
mount -t tmpfs -o mode=1777 tmp /root/tmp
mount -t tmpfs -o mode=755 run /root/run
hostname numa-guest
ifconfig lo 127.0.0.1 up
echo "numa-guest: $(grep -c ^processor /proc/cpuinfo) cpus," \
  "$(ls -d /sys/devices/system/node/node* | wc -l) NUMA nodes, running the command"
chroot /root /bin/sh "$out/command.sh"
status=$?
echo "$status" >"/root$out/exit-status"
sync
echo "$EXIT_MARKER$status"
poweroff -f
sleep 5
""".replace("$EXIT_MARKER", EXIT_MARKER)


def log(text):
    print("numa-guest: " + text, flush=True)


# --- What the guest needs from this system -----------------------------------

def find_kernel():
    """(vmlinuz path, version) of the newest kernel in /boot with modules, or None."""
    found = []
    for path in glob.glob("/boot/vmlinuz-*"):
        version = os.path.basename(path)[len("vmlinuz-"):]
        if os.path.isfile(os.path.join("/lib/modules", version, "modules.dep")):
            found.append((version, path))
    if not found:
        return None
    version, path = max(found)
    return path, version


def is_static_elf(path):
    """Whether path is a 64-bit little-endian ELF file without a program
    interpreter (PT_INTERP): a static executable, which runs in an
    initramfs that holds no libraries."""
    with open(path, "rb") as f:
        header = f.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return False
        phoff, = struct.unpack_from("<Q", header, 32)
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        if phentsize < 4 or phnum > 4096:
            return False
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    types = [struct.unpack_from("<I", table, i * phentsize)[0] for i in range(phnum)
             if (i + 1) * phentsize <= len(table)]
    return len(types) == phnum and 3 not in types  # 3: PT_INTERP


def find_busybox():
    """A statically linked busybox (busybox-static), or None."""
    for path in BUSYBOX_CANDIDATES:
        if os.path.isfile(path) and os.access(path, os.X_OK) and is_static_elf(path):
            return path
    return None


def missing_prerequisites():
    """What is missing to boot a guest (Debian packages named), or []."""
    missing = []
    if not shutil.which(QEMU):
        missing.append("%s (Debian: qemu-system-x86)" % QEMU)
    kernel = find_kernel()
    if kernel is None:
        missing.append("a kernel in /boot with its modules (Debian: linux-image-amd64)")
    elif not os.access(kernel[0], os.R_OK):
        missing.append("read access to %s (run as root)" % kernel[0])
    if find_busybox() is None:
        missing.append("a static busybox (Debian: busybox-static)")
    return missing


# --- The initramfs -------------------------------------------------------------

def read_module_deps(version):
    """{module name: (relative path, [dependency names])} from modules.dep,
    and the set of built-in module names."""
    base = os.path.join("/lib/modules", version)

    def name_of(path):
        return re.sub(r"\.ko(\.(xz|gz|zst))?$", "", os.path.basename(path)).replace("-", "_")

    deps = {}
    with open(os.path.join(base, "modules.dep")) as f:
        for line in f:
            if ":" not in line:
                continue
            path, rest = line.split(":", 1)
            deps[name_of(path)] = (path, [name_of(d) for d in rest.split()])
    builtin = set()
    builtin_path = os.path.join(base, "modules.builtin")
    if os.path.isfile(builtin_path):
        with open(builtin_path) as f:
            builtin = {name_of(line.strip()) for line in f if line.strip()}
    return deps, builtin


def module_load_order(version, wanted=GUEST_MODULES):
    """[(name, path)] of the modules to insmod, dependencies first."""
    deps, builtin = read_module_deps(version)
    order, seen = [], set()

    def visit(name, chain):
        if name in seen or name in builtin:
            return
        if name not in deps:
            raise RuntimeError("module %s (needed by %s) is neither in modules.dep nor built "
                               "into kernel %s" % (name, " <- ".join(chain) or "the guest",
                                                   version))
        for dep in deps[name][1]:
            visit(dep, chain + [name])
        seen.add(name)
        order.append((name, os.path.join("/lib/modules", version, deps[name][0])))

    for name in wanted:
        visit(name, [])
    return order


def read_module(path):
    """The module's ELF bytes, decompressed."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".xz"):
        return lzma.decompress(data)
    if path.endswith(".gz"):
        return gzip.decompress(data)
    if path.endswith(".zst"):
        if not shutil.which("zstd"):
            raise RuntimeError("%s is zstd-compressed and zstd is not installed" % path)
        return subprocess.run(["zstd", "-dc", path], check=True, capture_output=True).stdout
    return data


class Cpio:
    """A cpio archive in the "newc" format the kernel unpacks."""

    def __init__(self):
        self.data = bytearray()
        self.inode = 1

    def _entry(self, name, mode, body=b"", rdev=(0, 0)):
        name_bytes = name.encode() + b"\0"
        fields = [self.inode, mode, 0, 0, 1, 0, len(body), 0, 0, rdev[0], rdev[1],
                  len(name_bytes), 0]
        self.inode += 1
        self.data += b"070701" + b"".join(b"%08X" % v for v in fields) + name_bytes
        self.data += b"\0" * (-len(self.data) % 4)
        self.data += body
        self.data += b"\0" * (-len(self.data) % 4)

    def directory(self, name):
        self._entry(name, 0o040755)

    def file(self, name, body, executable=False):
        self._entry(name, 0o100755 if executable else 0o100644, body)

    def char_device(self, name, major, minor):
        self._entry(name, 0o020600, rdev=(major, minor))

    def finish(self):
        self._entry("TRAILER!!!", 0)
        return bytes(self.data)


def build_initramfs(cache_dir, version):
    """The initramfs for kernel version, made once per content in cache_dir."""
    busybox = find_busybox()
    modules = module_load_order(version)
    key = hashlib.sha256()
    key.update(INIT_SCRIPT.encode())
    for path in [busybox] + [p for _, p in modules]:
        st = os.stat(path)
        key.update(("%s %d %d\n" % (path, st.st_size, st.st_mtime_ns)).encode())
    path = os.path.join(cache_dir, "initramfs-%s-%s.cpio" % (version, key.hexdigest()[:12]))
    if os.path.isfile(path):
        return path
    archive = Cpio()
    for d in ("bin", "dev", "lib", "lib/modules", "proc", "sys", "root"):
        archive.directory(d)
    archive.char_device("dev/console", 5, 1)
    with open(busybox, "rb") as f:
        archive.file("bin/busybox", f.read(), executable=True)
    for name, module_path in modules:
        archive.file("lib/modules/%s.ko" % name, read_module(module_path))
    archive.file("lib/modules/load-order", "".join(n + "\n" for n, _ in modules).encode())
    archive.file("init", INIT_SCRIPT.encode(), executable=True)
    os.makedirs(cache_dir, exist_ok=True)
    tmp = path + ".tmp%d" % os.getpid()
    with open(tmp, "wb") as f:
        f.write(archive.finish())
    os.replace(tmp, path)
    for old in glob.glob(os.path.join(cache_dir, "initramfs-*.cpio")):
        if old != path:
            os.unlink(old)
    return path


# --- Booting ---------------------------------------------------------------------

def accel_args(accel):
    """QEMU's -accel and -cpu for accel ("tcg" or "kvm")."""
    # -cpu max: under TCG every feature QEMU emulates (AVX2, no AVX-512);
    # under KVM the host's.
    return accel, ["-accel", accel, "-cpu", "max"]


def write_command(out_dir, cwd, command, env):
    """The shell script the guest runs chrooted: the environment, the folder,
    then COMMAND (its status is the script's)."""
    lines = ["# Written by tests/numa/guest.py; run inside the guest."]
    base_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                # The shared root is read-only: caches (numaserve's GEMM
                # choices under ~/.cache) go to the guest's tmpfs.
                "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp",
                "NUMA_GUEST_OUT": out_dir,
                "NUMA_GUEST_TOPOLOGY": os.path.join(out_dir, "topology.json")}
    base_env.update(env)
    for name, value in sorted(base_env.items()):
        lines.append("export %s=%s" % (name, shlex.quote(value)))
    lines.append("cd %s || exit 126" % shlex.quote(cwd))
    lines.append(" ".join(shlex.quote(a) for a in command))
    with open(os.path.join(out_dir, "command.sh"), "w") as f:
        f.write("\n".join(lines) + "\n")


def qemu_command(topology, kernel, initramfs, out_dir, accel):
    args = [QEMU, "-nodefaults", "-no-user-config", "-no-reboot", "-display", "none",
            "-monitor", "none", "-chardev", "stdio,id=console,signal=off",
            "-serial", "chardev:console"]
    args += accel
    args += topologies.qemu_args(topology)
    args += ["-kernel", kernel, "-initrd", initramfs,
             "-append", "console=ttyS0 loglevel=3 panic=-1 rdinit=/init numaserve.out=" + out_dir]
    # The system's root, read-only; the run folder, writable.
    args += ["-fsdev", "local,id=root,path=/,security_model=none,readonly=on,multidevs=remap",
             "-device", "virtio-9p-pci,fsdev=root,mount_tag=root",
             "-fsdev", "local,id=out,path=%s,security_model=none,multidevs=remap" % out_dir,
             "-device", "virtio-9p-pci,fsdev=out,mount_tag=out"]
    return args


class Console:
    """Reads the guest's console in a thread: prints and keeps each line."""

    def __init__(self, stream, log_path, echo=True):
        self.lines = []
        self.status = None
        self.stopped = threading.Event()  # the guest cannot go on
        self.lock = threading.Lock()
        self.log = open(log_path, "w")
        self.echo = echo
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            with self.lock:
                self.lines.append(line)
                if line.startswith(EXIT_MARKER):
                    self.status = int(line[len(EXIT_MARKER):].strip() or "-1")
                if line.startswith("KVM internal error"):
                    self.stopped.set()
            self.log.write(line + "\n")
            self.log.flush()
            if self.echo:
                print(line, flush=True)

    def tail(self, n=40):
        with self.lock:
            return "\n".join(self.lines[-n:])

    def close(self):
        self.thread.join(5)
        self.log.close()


def prepare_run(args):
    """The run folder, emptied, with topology.json and command.sh; the
    initramfs and kernel. Raises RuntimeError naming what is wrong."""
    missing = missing_prerequisites()
    if missing:
        raise RuntimeError("cannot boot a guest, missing: " + "; ".join(missing))
    topology = topologies.TOPOLOGIES[args.topology]
    build_dir = os.path.abspath(args.build_dir)
    cache_dir = os.path.join(build_dir, "numa-guest")
    out_dir = os.path.join(cache_dir, "runs", args.topology)
    if not SAFE_PATH.match(out_dir):
        raise RuntimeError("the run folder %s has characters QEMU's options or the kernel's "
                           "command line cannot take (use [A-Za-z0-9._/+-])" % out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    with open(os.path.join(out_dir, "topology.json"), "w") as f:
        json.dump(dict(topology, name=args.topology), f, indent=1)
    env = dict(e.split("=", 1) for e in args.env)
    write_command(out_dir, os.getcwd(), args.command, env)
    kernel, version = find_kernel()
    initramfs = build_initramfs(cache_dir, version)
    return topology, kernel, initramfs, out_dir


def run_guest(args):
    try:
        topology, kernel, initramfs, out_dir = prepare_run(args)
    except (RuntimeError, OSError) as e:
        log(str(e))
        return EXIT_CANNOT_BOOT
    accel_name, accel = accel_args(args.accel)
    command = qemu_command(topology, kernel, initramfs, out_dir, accel)
    log("booting topology %s (%s) with %s, limit %d s"
        % (args.topology, topology["summary"], accel_name, args.timeout))
    started = time.monotonic()
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    console = Console(proc.stdout, os.path.join(out_dir, "console.log"), echo=not args.quiet)
    deadline = started + args.timeout
    while proc.poll() is None and time.monotonic() < deadline and not console.stopped.is_set():
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        console.close()
        if console.stopped.is_set():
            log("KVM cannot run this guest (topology %s); use --accel tcg. The console's last "
                "lines:\n%s" % (args.topology, console.tail()))
            return EXIT_CANNOT_BOOT
        log("the guest (topology %s) did not finish within %d s: killed. Its console's last "
            "lines:\n%s" % (args.topology, args.timeout, console.tail()))
        return EXIT_HUNG
    console.close()
    elapsed = time.monotonic() - started
    status = console.status
    status_file = os.path.join(out_dir, "exit-status")
    if os.path.isfile(status_file):
        with open(status_file) as f:
            text = f.read().strip()
        status = int(text) if text.lstrip("-").isdigit() else status
    if status is None:
        log("the guest (topology %s) stopped after %.0f s without reporting the command's "
            "status (QEMU exit code %d). Its console's last lines:\n%s"
            % (args.topology, elapsed, proc.returncode, console.tail()))
        return EXIT_NO_STATUS
    log("topology %s: the command exited %d; the guest ran %.0f s" % (args.topology, status,
                                                                       elapsed))
    return status


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topology", choices=sorted(topologies.TOPOLOGIES))
    parser.add_argument("--build-dir", default="build/release")
    parser.add_argument("--timeout", type=int, default=600,
                        help="seconds before a guest counts as hung (default 600)")
    parser.add_argument("--accel", choices=("kvm", "tcg"),
                        default=os.environ.get("NUMA_GUEST_ACCEL", "tcg"))
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of the command in the guest")
    parser.add_argument("--quiet", action="store_true", help="do not print the console")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--prerequisites", action="store_true")
    parser.add_argument("command", nargs="*")
    args = parser.parse_args()
    if args.list:
        for name, topology in sorted(topologies.TOPOLOGIES.items()):
            print("%-26s %s" % (name, topology["summary"]))
        return 0
    if args.prerequisites:
        missing = missing_prerequisites()
        print("\n".join(missing) if missing else "everything a guest needs is here")
        return 1 if missing else 0
    if not args.topology or not args.command:
        parser.error("--topology and a command are required")
    for e in args.env:
        if "=" not in e or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", e):
            parser.error("--env takes NAME=VALUE, got %r" % e)
    return run_guest(args)


if __name__ == "__main__":
    sys.exit(main())
