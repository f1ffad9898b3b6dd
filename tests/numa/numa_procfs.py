"""What /proc says about a process's placement, for the NUMA guest checks:
its allowed cpus, its memory policy and where its pages lie (numa_maps).

  allowed_cpus(pid)       Cpus_allowed_list of /proc/PID/status, as a list
  NumaMaps.read(pid)      /proc/PID/numa_maps parsed: per mapping its policy,
                          kind (anon, shm, file) and pages per node
"""

import collections
import re

_NODE_PAGES = re.compile(r"^N(\d+)=(\d+)$")


def parse_cpu_list(text):
    """"0-3,8" -> [0, 1, 2, 3, 8]."""
    cpus = []
    for item in text.strip().split(","):
        if not item:
            continue
        first, _, last = item.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return sorted(set(cpus))


def allowed_cpus(pid):
    """The cpus PID may run on (Cpus_allowed_list)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return parse_cpu_list(line.split(":", 1)[1])
    raise RuntimeError("/proc/%d/status has no Cpus_allowed_list" % pid)


Mapping = collections.namedtuple("Mapping", "address policy kind name pages")


class NumaMaps:
    """/proc/PID/numa_maps. kind: "anon" (private anonymous: heap, stacks,
    malloc arenas, the copied-on-write data of libraries), "shm"
    (memfd, /dev/shm, SysV: shared memory), "file" (page cache of files)."""

    def __init__(self, text):
        self.text = text
        self.mappings = []
        for line in text.splitlines():
            fields = line.split()
            if len(fields) < 2:
                continue
            # The policy column: "default", "local", "bind:0", "prefer:1",
            # "interleave:0-1", and "prefer (many):0" (MPOL_PREFERRED_MANY,
            # what hwloc sets for a non-strict bind), two fields here.
            policy, rest = fields[1], fields[2:]
            if rest and rest[0].startswith("(many)"):
                policy, rest = policy + " " + rest[0], rest[1:]
            pages, name, anon = {}, "", False
            for field in rest:
                match = _NODE_PAGES.match(field)
                if match:
                    pages[int(match.group(1))] = int(match.group(2))
                elif field.startswith("file="):
                    name = field[len("file="):]
                elif field.startswith("anon="):
                    anon = True
                elif field in ("heap", "stack"):
                    name = field
            if name.startswith(("/memfd:", "/dev/shm/", "/SYSV")):
                kind = "shm"
            elif anon or not name.startswith("/"):
                kind = "anon"
            else:
                kind = "file"
            self.mappings.append(Mapping(fields[0], policy, kind, name, pages))

    @classmethod
    def read(cls, pid):
        with open("/proc/%d/numa_maps" % pid) as f:
            return cls(f.read())

    def pages_by_node(self, kinds=("anon", "shm")):
        """{node: pages} over the mappings of the given kinds."""
        total = collections.Counter()
        for m in self.mappings:
            if m.kind in kinds:
                total.update(m.pages)
        return dict(total)

    def local_fraction(self, node, kinds=("anon", "shm")):
        """(pages on node / all pages of those kinds, all pages)."""
        pages = self.pages_by_node(kinds)
        total = sum(pages.values())
        return (pages.get(node, 0) / total if total else 0.0), total

    def policies(self):
        """Counter of the policy column ("bind:0", "prefer (many):1", "local")."""
        return collections.Counter(m.policy for m in self.mappings)

    def off_node(self, node, kinds=("anon", "shm"), limit=8):
        """The largest mappings with pages off node, as text, for failure messages."""
        rows = [(sum(n for k, n in m.pages.items() if k != node), m) for m in self.mappings
                if m.kind in kinds]
        rows = sorted((r for r in rows if r[0] > 0), key=lambda r: -r[0])[:limit]
        return "\n".join("  %s %s %s %s pages %s" % (m.address, m.policy, m.kind,
                                                     m.name or "-", m.pages) for _, m in rows)

    def summary(self, kinds=("anon", "shm")):
        """"N0=1234 N1=5" over the mappings of the given kinds."""
        pages = self.pages_by_node(kinds)
        return " ".join("N%d=%d" % (n, pages[n]) for n in sorted(pages)) or "no pages"
