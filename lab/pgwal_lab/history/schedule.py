"""Steps of a history and their text form.

A step is one fault or operation on the cluster, with the level the
ledger workload runs at during it and its timing:

    kind[:target[:arg[:arg]]]@level/load_ms/moment_ms

for example `failover:n3@on/800/250`, `rebuild:n4:n2:fetch@local/400/0`,
`uw:off@remote_write/500/0`.  A schedule is steps joined by spaces; it
replays exactly (the explorer draws nothing else at random), and a step
whose precondition no longer holds when replayed (a shrunk schedule may
promote a node that is already primary) is skipped, not an error.

The next step is drawn from the cluster's current roles (`State`), so a
seed reproduces a history too.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from ..audit.faults import REWIND_CUT_AFTER_END_MS
from ..util import LabError

# kind -> (weight, what it does); the docs' table is built from this
KINDS = {
    "kill": (2, "every process of a node SIGKILLed at once, the node restarted (crash recovery)"),
    "power": (2, "a node's processes killed and its unsynced writes dropped (emulated power loss), restarted"),
    "switch-power": (1, "pg_switch_wal() on the primary, then at once a power loss of a node"),
    "held-power": (1, "the primary's WAL fsyncs held for the moment, then its power lost (commits released "
                      "early are visible meanwhile)"),
    "failover": (2, "the primary's links stalled for the moment (commits in flight), then its power lost, a "
                    "standby promoted, the others repointed (pg_rewind for a node that replayed past the fork); "
                    "the old primary stays down until a rejoin"),
    "failover-both": (1, "as failover, but the standby loses power together with the primary: it restarts "
                         "(crash recovery of its own WAL) before it is promoted"),
    "rejoin": (0, "a former primary rewound (pg_rewind) and started as a standby of the primary"),
    "rewind-power": (0, "as rejoin, but the host of the former primary loses power while pg_rewind runs "
                        "(its writes not yet synced are lost; the rewind is cut short), or, half of the time, "
                        "the moment it ended, before the node started; then what a cluster manager does: pg_rewind "
                        "again, or, where that refuses, a base backup of the primary.  The node must then "
                        "stream and hold the primary's rows.  Drawn as a third of the rejoins drawn"),
    "partition": (1, "a standby's link cut for the moment (connections reset, reconnects refused), then healed"),
    "restart": (1, "a clean restart of a node (pg_ctl -m fast)"),
    "uw": (1, "stream_unflushed_wal set on every node (written or off)"),
    "fw": (1, "a standby's wal_receiver_flush_worker turned on or off"),
    "rebuild": (1, "a standby replaced by a pg_basebackup of another standby (-X stream or -X fetch), following "
                   "the same upstream as before"),
    "sync": (1, "another direct standby of the primary made its synchronous standby (put first among the "
                "FIRST 1 candidates), so that failovers reach every standby's settings as the synchronous one"),
    "held-failover-both": (1, "the standby's WAL fsyncs held for the moment while the load goes on (a flush "
                              "worker's walreceiver acknowledges receipt meanwhile), then it and the primary lose "
                              "power together; it restarts and is promoted"),
    "paused-failover": (0, "the primary stopped (SIGSTOP) for the moment with commits in flight, a standby "
                           "promoted and the others repointed meanwhile; then the old primary continues for "
                           "0.5 s (ZOMBIE_S), a zombie that still takes commits (those that wait for a standby find "
                           "none), and is fenced (SIGKILL) as a cluster manager would; it stays down until a "
                           "rejoin.  Drawn as a quarter of the failovers"),
    "one-way-failover": (0, "as failover, but the primary's links stall in one direction only: its WAL is held "
                            "while the standbys' replies still reach it (status replies every second), for 1.1 "
                            "to 2.5 s; a primary that counted held WAL as received or flushed would release "
                            "commits the failover loses.  Drawn as a third of the plain failovers that are "
                            "neither paused-failover nor promote-power"),
    "promote-power": (0, "as failover, and the promoted standby loses power the given milliseconds after its "
                         "promotion was requested (promote-power:N:MS), or the moment its new timeline's history "
                         "file appears (promote-power:N:history, half of them), while it promotes; it restarts, "
                         "and is promoted again if it came back a standby.  Drawn as a fifth of the other "
                         "plain failovers and half of the failover-both"),
    "kill-proc": (1, "one server process SIGKILLed (primary: a walsender or a client backend; standby: the "
                     "walreceiver, the startup process or the flush worker): its postmaster reinitializes, as "
                     "after a segfault or the OOM killer (after the startup process it exits instead, and the "
                     "node is started again)"),
    "power-in-recovery": (1, "a node's power lost, and lost again the moment after it started, while it "
                             "recovers from the first; half of them on the primary, lost again the moment its "
                             "crash recovery's timeline switch wrote its history file (or once it recovered, "
                             "if it did not switch)"),
    "pause": (1, "every process of a node stopped (SIGSTOP) for the moment while the load goes on, then "
                 "continued"),
    "io-stall": (1, "a node's WAL fsyncs held for the moment while the load goes on (a disk that stalls), then "
                    "released"),
    "summarize": (1, "summarize_wal set on every node (on or off)"),
    "disk-full": (0, "a node's file system (data directory and pg_wal), or the shared archive's, filled for the "
                     "moment while the load goes on, then freed: writes that need new space fail (a WAL segment "
                     "that cannot be created is a PANIC; archiving fails and is retried), the node must serve "
                     "again without help, or after one start where its postmaster gave up.  Drawn as a third of "
                     "the io-stall steps, a quarter of those on the archive"),
}
# the faults that crash a node while the workload runs
CRASHES = ("kill", "power", "switch-power", "held-power", "failover", "failover-both", "held-failover-both",
           "kill-proc", "power-in-recovery", "paused-failover", "promote-power", "one-way-failover")
FAILOVERS = ("failover", "failover-both", "held-failover-both", "paused-failover", "promote-power",
             "one-way-failover")
# a one-way stall outlasts the standbys' status interval (1 s), so that the
# primary hears from them while its WAL is held
ONE_WAY_MS = (1100, 2500)
# how long a paused-failover's old primary runs as a zombie before its fence
ZOMBIE_S = 0.5
# how long pg_rewind runs before its host loses power (it takes about
# 0.3-0.5 s here: some cuts fall after its end, before the node started);
# half of the cuts come the moment it ended instead (REWIND_CUT_AFTER_END_MS),
# which a timed cut reached in 5% of them: a finished target rewound again
# is what 0019 refuses, and a mutant without the refusal went unseen
REWIND_CUT_MS = (0, 600)
# a power-in-recovery moment that cuts the second power loss the moment the
# node's crash recovery wrote the history file of a timeline switch (the
# crash switch of stream_unflushed_wal = written), before its end-of-recovery
# record: a switch that did not complete, which leaves the history file
# behind and makes the next switch skip its ID.  Timed cuts hit that window
# of milliseconds rarely, and a mutant that loses the standbys after such a
# gap went unseen
AT_CRASH_SWITCH = 99_999
# the steps that are faults (a history of N faults counts these)
FAULTS = CRASHES + ("partition", "pause", "io-stall", "disk-full", "rewind-power")
# the processes kill-proc draws from, by role
PRIMARY_PROCS = ("walsender", "backend")
STANDBY_PROCS = ("walreceiver", "startup")


@dataclass(frozen=True)
class Step:
    kind: str
    args: tuple = ()
    level: str = "on"
    load_ms: int = 500
    moment_ms: int = 0

    def __str__(self) -> str:
        head = ":".join([self.kind, *self.args])
        return f"{head}@{self.level}/{self.load_ms}/{self.moment_ms}"

    @classmethod
    def parse(cls, text: str) -> "Step":
        try:
            head, timing = text.split("@", 1)
            level, load_ms, moment_ms = timing.split("/")
            kind, *args = head.split(":")
            if kind not in KINDS:
                raise ValueError(f"unknown kind {kind!r}")
            return cls(kind, tuple(args), level, int(load_ms), int(moment_ms))
        except ValueError as e:
            raise LabError(f"bad step {text!r} (kind[:target...]@level/load_ms/moment_ms): {e}") from None


def format_schedule(steps) -> str:
    return " ".join(str(s) for s in steps)


def parse_schedule(text: str) -> list[Step]:
    return [Step.parse(t) for t in text.split()]


@dataclass
class State:
    """What the generator needs to know of the cluster's roles."""
    primary: str
    standbys: dict                    # name -> upstream name
    down: list = field(default_factory=list)  # former primaries awaiting a rejoin
    has_uw: bool = True               # the server has stream_unflushed_wal
    has_fw: bool = True               # ... and wal_receiver_flush_worker
    sync_first: str | None = None     # the candidate a `sync` step put first
    fw_on: tuple = ()                 # standbys whose flush worker is on
    has_summarize: bool = False       # the server has summarize_wal (17 on)
    has_disks: bool = True            # every node has a file system of its own (disk-full)

    def direct(self) -> list:
        """The primary's direct standbys, in name order."""
        return sorted(s for s, up in self.standbys.items() if up == self.primary)

    def sync_standby(self) -> str | None:
        """The synchronous standby while all run: the primary's direct
        standbys are its candidates (FIRST 1), the one a `sync` step chose
        first, then the others in name order."""
        direct = self.direct()
        if self.sync_first in direct:
            return self.sync_first
        return direct[0] if direct else None

    def below(self, name: str) -> set:
        """Nodes that follow `name`, directly or through a cascade."""
        out: set = set()
        todo = [name]
        while todo:
            n = todo.pop()
            for s, up in self.standbys.items():
                if up == n and s not in out:
                    out.add(s)
                    todo.append(s)
        return out


def next_step(rng: random.Random, st: State, levels: list[str], load_ms=(300, 1500),
              moment_ms=(50, 300), cut_ms=(100, 1000), stall_ms=(100, 500), pause_ms=(200, 3000),
              recovery_ms=(20, 400)) -> Step:
    """Draw the next step for the cluster as it is now.  A node down since a
    failover is rejoined soon (more often than not at the next step), and at
    most one node is down at a time, so that three nodes always serve."""
    level = rng.choice(levels)
    load = rng.randint(*load_ms)
    live = [st.primary, *st.standbys]
    if st.down and rng.random() < 0.6:
        # a third of them lose power during pg_rewind (from a generator of
        # their own, so that a seed's other draws stay as they were)
        side = random.Random(load * 104_729 + 11)
        if side.random() < 1 / 3:
            moment = side.randint(*REWIND_CUT_MS) if side.random() < 0.5 else REWIND_CUT_AFTER_END_MS
            return Step("rewind-power", (st.down[0],), level, load, moment)
        return Step("rejoin", (st.down[0],), level, load)
    kinds = [k for k, (w, _) in KINDS.items() for _ in range(w)]
    while True:
        kind = rng.choice(kinds)
        if kind in ("kill", "power", "switch-power", "restart"):
            return Step(kind, (rng.choice(live),), level, load)
        if kind == "power-in-recovery":
            node, moment = rng.choice(live), rng.randint(*recovery_ms)
            # half of them on the primary the moment its crash recovery's
            # timeline switch wrote its history file (from a generator of
            # their own, so that a seed's other draws stay as they were)
            if st.has_uw and random.Random(load * 7_919 + 3).random() < 0.5:
                node, moment = st.primary, AT_CRASH_SWITCH
            return Step(kind, (node,), level, load, moment)
        if kind == "held-power":
            return Step(kind, (st.primary,), level, load, rng.randint(*moment_ms))
        if kind in FAILOVERS and not st.down and st.standbys:
            # mostly to the synchronous standby, where the levels promise
            # something: a failover to another one is judged as promising nothing
            sync = st.sync_standby()
            target = sync if sync and rng.random() < 0.7 else rng.choice(sorted(st.standbys))
            # a held failover tests what a standby reported flushed while its
            # fsyncs were held, which only a flush worker reports early: to a
            # standby whose worker is on, more often than not
            fw_direct = [s for s in st.direct() if s in st.fw_on]
            if kind == "held-failover-both" and fw_direct and rng.random() < 0.7:
                target = rng.choice(fw_direct)
            # the links stall this long before the power loss, so commits are
            # in flight when it strikes; drawn from its own generator, so that
            # a seed's other draws stay what they were before the stall
            side = random.Random(load * 1_000_003 + sum(map(ord, target)))
            stall = side.randint(*stall_ms)
            # a quarter of the plain failovers find the primary frozen rather
            # than dead, and it comes back (from the same side generator)
            if kind == "failover" and side.random() < 0.25:
                kind = "paused-failover"
            elif (kind == "failover" and side.random() < 0.2) or (kind == "failover-both" and side.random() < 0.5):
                # the promoted standby loses power while it promotes
                # at a drawn moment, or the moment the history file appears:
                # the few milliseconds before the end-of-recovery record.
                # Judged as failover-both (the target lost power), so half
                # of those are drawn as this too
                at = "history" if side.random() < 0.5 else str(side.randint(0, 150))
                return Step("promote-power", (target, at), level, load, stall)
            elif kind == "failover" and side.random() < 1 / 3:
                # the primary's WAL stalls but the replies flow
                return Step("one-way-failover", (target,), level, load, side.randint(*ONE_WAY_MS))
            return Step(kind, (target,), level, load, stall)
        if kind == "kill-proc":
            node = rng.choice(live)
            procs = PRIMARY_PROCS if node == st.primary else \
                STANDBY_PROCS + (("flush-worker",) if node in st.fw_on else ())
            return Step(kind, (node, rng.choice(procs)), level, load)
        if kind in ("pause", "io-stall"):
            node, moment = rng.choice(live), rng.randint(*pause_ms)
            # a third of the stalled disks are full instead (decided from a
            # generator of their own, so a seed's other draws stay as they were)
            side = random.Random(load * 7_919 + moment)
            if kind == "io-stall" and st.has_disks and side.random() < 1 / 3:
                kind = "disk-full"
                if side.random() < 0.25:  # the shared archive's
                    node = "archive"
            return Step(kind, (node,), level, load, moment)
        if kind == "summarize" and st.has_summarize:
            return Step(kind, (rng.choice(["on", "off"]),), level, load)
        if kind == "partition" and st.standbys:
            return Step(kind, (rng.choice(sorted(st.standbys)),), level, load, rng.randint(*cut_ms))
        if kind == "uw" and st.has_uw:
            return Step(kind, (rng.choice(["written", "off"]),), level, load)
        if kind == "fw" and st.has_fw and st.standbys:
            # the synchronous standby's worker half the time, and on more
            # often than off: the promises it touches live there
            sync = st.sync_standby()
            node = sync if sync and rng.random() < 0.5 else rng.choice(sorted(st.standbys))
            return Step(kind, (node, "on" if rng.random() < 2 / 3 else "off"), level, load)
        if kind == "sync":
            others = [s for s in st.direct() if s != st.sync_standby()]
            if others:
                return Step(kind, (rng.choice(others),), level, load)
        if kind == "rebuild":
            pairs = [(x, y) for x in sorted(st.standbys) for y in sorted(st.standbys)
                     if x != y and x not in _chain(st, y)]
            if pairs:
                x, y = rng.choice(pairs)
                return Step(kind, (x, y, rng.choice(["stream", "fetch"])), level, load)


def _chain(st: State, name: str) -> list:
    """`name`'s upstreams up to the primary."""
    out = []
    while name in st.standbys:
        name = st.standbys[name]
        out.append(name)
    return out


def applicable(step: Step, st: State) -> str | None:
    """Why the step cannot run on the cluster as it is (None: it can).  A
    replayed (shrunk) schedule skips such steps."""
    live = [st.primary, *st.standbys]
    a = step.args
    if step.kind in ("kill", "power", "switch-power", "restart", "power-in-recovery"):
        return None if a and a[0] in live else f"{a[0] if a else '?'} is not running"
    if step.kind == "held-power":
        return None if a and a[0] == st.primary else f"{a[0] if a else '?'} is not the primary"
    if step.kind == "promote-power" and (len(a) != 2 or not (a[1] == "history" or a[1].isdigit())):
        return "promote-power takes N:MS or N:history"
    if step.kind in FAILOVERS:
        if st.down:
            return f"{st.down[0]} is still down"
        return None if a and a[0] in st.standbys else f"{a[0] if a else '?'} is not a standby"
    if step.kind in ("rejoin", "rewind-power"):
        return None if a and a[0] in st.down else f"{a[0] if a else '?'} is not down"
    if step.kind == "partition":
        return None if a and a[0] in st.standbys else f"{a[0] if a else '?'} is not a standby"
    if step.kind == "kill-proc":
        if len(a) != 2 or a[0] not in live:
            return f"{a[0] if a else '?'} is not running"
        procs = PRIMARY_PROCS if a[0] == st.primary else STANDBY_PROCS + ("flush-worker",)
        if a[1] not in procs:
            return f"{a[0]} runs no {a[1]} to kill ({'primary' if a[0] == st.primary else 'standby'})"
        if a[1] == "flush-worker" and a[0] not in st.fw_on:
            return f"{a[0]}'s flush worker is off"
        return None
    if step.kind in ("pause", "io-stall", "disk-full"):
        if step.kind == "disk-full" and not st.has_disks:
            return "the nodes have no file systems of their own (not root, or PGWAL_LAB_NO_LOOP)"
        archive = step.kind == "disk-full" and a and a[0] == "archive"
        return None if a and (archive or a[0] in live) else f"{a[0] if a else '?'} is not running"
    if step.kind == "summarize":
        return None if st.has_summarize else "the server has no summarize_wal"
    if step.kind == "uw":
        return None if st.has_uw else "the server has no stream_unflushed_wal"
    if step.kind == "fw":
        if not st.has_fw:
            return "the server has no wal_receiver_flush_worker"
        return None if a and a[0] in st.standbys else f"{a[0] if a else '?'} is not a standby"
    if step.kind == "sync":
        return None if a and a[0] in st.direct() else f"{a[0] if a else '?'} is not a standby of the primary"
    if step.kind == "rebuild":
        if len(a) != 3 or a[0] not in st.standbys or a[1] not in st.standbys or a[0] == a[1]:
            return "needs two standbys"
        return None if a[0] not in _chain(st, a[1]) else f"{a[1]} follows {a[0]}"
    return f"unknown kind {step.kind}"
