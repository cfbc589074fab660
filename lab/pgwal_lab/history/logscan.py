"""Reading every node's server log after every step of a history.

A history can pass its safety and convergence checks while a server it ran
on failed an assertion (a standby's startup process that TRAPs is restarted
by its postmaster, and the cluster catches up), PANICked, or lost a process
to a signal no fault sent.  The explorer's faults never produce such lines:
a crash or power loss kills the node's whole process tree at once, so its
postmaster logs nothing about it, and a failover crashes the old primary the
same way.  So after every step each node's log lines written since the last
scan are read and these fail the history:

- `TRAP:` (an assertion failed; the check build has assertions);
- `PANIC:`;
- a process "terminated by signal" or "exited with exit code" that made the
  postmaster reinitialize ("terminating any other active server processes",
  "all server processes terminated; reinitializing"): a crash-restart cycle
  nobody asked for.

A `disk-full` step expects, on its node only, a PANIC that says "No space
left on device" (a WAL segment it could not create), the abort (signal 6)
the PANIC ends in, and the reinitialization that follows; a TRAP, any other
PANIC or signal still fails.

The other exception is the `kill-proc` step, which SIGKILLs one server
process on purpose: on that node, in that step's scan, the line naming
that process's exit by signal 9 and the reinitialization it causes are
expected (another process the reinitialization had to SIGKILL too); any
other signal, a TRAP or a PANIC still fails.

Replication processes' FATAL and ERROR lines are counted, not judged: a
fault makes walreceivers and walsenders lose their streams on purpose.

A power loss can take the log's unflushed tail with it, so a log shorter
than at the last scan is read from its start again; lines seen before are
skipped, so nothing is judged twice.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

# a line the explorer's faults never cause: (kind, pattern)
FAILING = (
    ("trap", re.compile(r"\bTRAP: ")),
    ("panic", re.compile(r"\bPANIC: ")),
    ("crash-restart", re.compile(r"(terminating any other active server processes"
                                 r"|all server processes terminated; reinitializing)")),
    ("signal", re.compile(r"was terminated by signal \d+")),
)
# counted for the record: a stream lost, a replication command refused
REPLICATION_ERROR = re.compile(
    r"\b(FATAL|ERROR): .*(WAL stream|replication|walreceiver|walsender|timeline|upstream)", re.I)


@dataclass
class Finding:
    node: str
    kind: str
    line: str

    def __str__(self) -> str:
        return f"{self.kind} on {self.node}: {self.line.strip()[:240]}"


@dataclass
class NodeLog:
    path: Path
    offset: int = 0
    seen: set = field(default_factory=set)

    def new_lines(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:   # a power loss took the unflushed tail
            self.offset = 0
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        # an incomplete last line is read at the next scan
        cut = data.rfind(b"\n") + 1
        self.offset += cut
        out = []
        for raw in data[:cut].splitlines():
            h = hashlib.blake2b(raw, digest_size=12).digest()
            if h in self.seen:
                continue
            self.seen.add(h)
            out.append(raw.decode("utf-8", "replace"))
        return out


def classify(node: str, lines: list[str]) -> tuple[list[Finding], int]:
    """The failing lines among `lines`, and the number of replication
    errors."""
    found: list[Finding] = []
    repl = 0
    for line in lines:
        for kind, pat in FAILING:
            if pat.search(line):
                found.append(Finding(node, kind, line))
                break
        else:
            if REPLICATION_ERROR.search(line):
                repl += 1
    return found, repl


_KILLED = re.compile(r"\(PID (\d+)\) was terminated by signal 9\b")


class LogScanner:
    """One per history: remembers how far each node's log was read."""

    def __init__(self):
        self.logs: dict[str, NodeLog] = {}
        self.expected: dict[str, int] = {}  # node -> pid a kill-proc step killed
        self.disk_full: set = set()  # nodes a disk-full step filled

    def expect_kill(self, node: str, pid: int) -> None:
        """The next scan expects `node` to log the SIGKILL of `pid` and to
        reinitialize after it."""
        self.expected[node] = int(pid)

    def expect_disk_full(self, node: str) -> None:
        """The next scan allows `node` to PANIC for want of space, and what follows."""
        self.disk_full.add(node)

    def _expected(self, f: Finding, seen_kill: set) -> bool:
        if f.node in self.disk_full:
            if f.kind == "panic" and "No space left on device" in f.line:
                return True
            if f.kind == "signal" and re.search(r"was terminated by signal 6\b", f.line):
                return True
            if f.kind == "crash-restart":
                return True
        pid = self.expected.get(f.node)
        if pid is None:
            return False
        m = _KILLED.search(f.line)
        if f.kind == "signal" and m:
            if int(m.group(1)) == pid:
                seen_kill.add(f.node)
                return True
            return f.node in seen_kill  # killed by the reinitialization that followed
        return f.kind == "crash-restart" and f.node in seen_kill

    def scan(self, nodes) -> tuple[list[Finding], dict]:
        """Read what every node logged since the last scan.  `nodes` are
        topology nodes (name, logfile).  Returns the failing lines and the
        per-node count of replication errors."""
        findings: list[Finding] = []
        repl: dict = {}
        seen_kill: set = set()
        for n in nodes:
            log = self.logs.get(n.name)
            if log is None or log.path != Path(n.logfile):
                log = self.logs[n.name] = NodeLog(Path(n.logfile))
            f, r = classify(n.name, log.new_lines())
            findings += [x for x in f if not self._expected(x, seen_kill)]
            if r:
                repl[n.name] = r
        # the step's kill must show: else it hit no server process
        findings += [Finding(node, "kill-not-logged", f"no line logs the SIGKILL of PID {pid} that the step sent")
                     for node, pid in self.expected.items() if node not in seen_kill]
        self.expected = {}
        self.disk_full = set()
        return findings, repl
