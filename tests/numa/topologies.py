"""The guest machines of the NUMA tests: each a QEMU topology (sockets, cores,
NUMA nodes with their cpus and memory) that tests/numa/guest.py boots.

A topology is plain data. The launcher turns it into QEMU's -smp, -object
memory-backend-ram and -numa options; the tests inside the guest read the
same data (written as JSON beside the run) as the truth numaserve's view of
the machine is checked against.

  nodes: one entry per NUMA node, in node order: its cpus (empty for a
         memory-only node, such as CXL memory or HBM without cores) and its
         memory in MiB.
  sockets, cores: QEMU's -smp sockets= and cores= (one thread per core); the
         cpus of socket s are s*cores .. s*cores+cores-1.
"""

# Node memory: enough for the front end, a worker, Python and the test's
# files in tmpfs, small enough that a boot stays quick.
_MIB = 768

TOPOLOGIES = {
    # Two packages, one node each, plus a node with memory and no cpus
    # (CXL-attached memory, a memory-side HBM node): 3 NUMA nodes, 2 workers.
    "two-packages-memory-node": {
        "summary": "2 packages x 1 node x 2 cores, plus a memory-only node",
        "sockets": 2, "cores": 2,
        "nodes": [
            {"cpus": [0, 1], "mib": _MIB},
            {"cpus": [2, 3], "mib": _MIB},
            {"cpus": [], "mib": 512},
        ],
    },
    # One package split into two nodes (Intel SNC2, AMD NPS2).
    "one-package-two-nodes": {
        "summary": "1 package x 2 nodes x 2 cores (SNC2 / NPS2)",
        "sockets": 1, "cores": 4,
        "nodes": [
            {"cpus": [0, 1], "mib": _MIB},
            {"cpus": [2, 3], "mib": _MIB},
        ],
    },
    # Four single-core nodes on two packages (AMD NPS4-like on two sockets):
    # --max-workers 2 must take one node of each package.
    "four-nodes": {
        "summary": "2 packages x 2 nodes x 1 core (NPS4-like)",
        "sockets": 2, "cores": 2,
        "nodes": [
            {"cpus": [0], "mib": 512},
            {"cpus": [1], "mib": 512},
            {"cpus": [2], "mib": 512},
            {"cpus": [3], "mib": 512},
        ],
    },
}

# The short run of `make test` (ctest numa.guest_short) boots this one.
SHORT_TOPOLOGY = "two-packages-memory-node"


def package_of_cpu(topology, cpu):
    """The socket (package) of cpu in topology."""
    return cpu // topology["cores"]


def distance(topology, a, b):
    """The SLIT distance QEMU reports between nodes a and b: 10 local, 12
    within a package, 21 across packages, 30 to or from a memory-only node."""
    if a == b:
        return 10
    cpus_a, cpus_b = topology["nodes"][a]["cpus"], topology["nodes"][b]["cpus"]
    if not cpus_a or not cpus_b:
        return 30
    same = package_of_cpu(topology, cpus_a[0]) == package_of_cpu(topology, cpus_b[0])
    return 12 if same else 21


def qemu_args(topology):
    """The -m, -smp, -object and -numa options of topology."""
    nodes = topology["nodes"]
    cpus = sorted(c for n in nodes for c in n["cpus"])
    sockets, cores = topology["sockets"], topology["cores"]
    if cpus != list(range(sockets * cores)):
        raise ValueError("topology's node cpus %s are not 0..%d" % (cpus, sockets * cores - 1))
    total = sum(n["mib"] for n in nodes)
    args = ["-m", "%dM" % total,
            "-smp", "%d,sockets=%d,cores=%d,threads=1" % (sockets * cores, sockets, cores)]
    for i, node in enumerate(nodes):
        args += ["-object", "memory-backend-ram,id=m%d,size=%dM" % (i, node["mib"])]
        spec = "node,nodeid=%d,memdev=m%d" % (i, i)
        if node["cpus"]:
            first, last = min(node["cpus"]), max(node["cpus"])
            if sorted(node["cpus"]) != list(range(first, last + 1)):
                raise ValueError("node %d's cpus %s are not a range" % (i, node["cpus"]))
            spec += ",cpus=%d-%d" % (first, last)
        args += ["-numa", spec]
    for a in range(len(nodes)):
        for b in range(a + 1, len(nodes)):
            args += ["-numa", "dist,src=%d,dst=%d,val=%d" % (a, b, distance(topology, a, b))]
    return args
