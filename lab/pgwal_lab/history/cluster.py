"""The cluster a history lives on, and the operations that move its roles.

Four nodes at the start: n1 primary; n2 and n3 its standbys (both
synchronous candidates, `FIRST 1 (n2, n3)`); n4 a cascading standby of n3.
Every standby streams through a delay proxy (so any link can be cut),
every node has a volatile page cache (power loss) and WAL fsyncs the audit
can hold, accepts unflushed WAL where the server has
wal_receiver_accept_unflushed, and archives with archive_mode = always
into one shared archive, on a file system of its own (so that a
`disk-full:archive` step can fill it).

The archive command links a copy of the segment under its name and
refuses a name that already holds other bytes: the other copy is kept in
archive/conflicts for the verdict, and the command fails (the node's
archiver retries, as it would in a real cluster).

Roles move as a cluster manager would move them (Patroni's order): after a
failover every standby of the old primary follows the promoted node; one
that replayed past the fork point of the new timeline (the switch point in
the promoted node's history file) is first rewound with pg_rewind, as are
the nodes below it that did.  Nodes below the promoted node follow its
timeline switch by cascade and are never rewound.  The old primary stays down until a `rejoin`.
Every direct standby of the primary is a synchronous candidate.
"""
from __future__ import annotations

import filecmp
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from .. import topology
from ..audit import faults
from ..disk import Disk
from ..util import LabError, chown_to_pg, run, wait_for

NAMES = ("n1", "n2", "n3", "n4")

ARCHIVE_SH = """#!/bin/sh
# archive_command of the history explorer: $1 = %p, $2 = %f, $3 = node.
# A name is archived once (ln fails if it exists); the same bytes again are
# fine, other bytes are a conflict, kept for the verdict.
dir={dir}
tmp="$dir/tmp/$2.$3.$$"
cp "$1" "$tmp" || exit 1
if ln "$tmp" "$dir/$2" 2>/dev/null || cmp -s "$tmp" "$dir/$2"; then
    rm -f "$tmp"
    exit 0
fi
mv "$tmp" "$dir/conflicts/$2.from-$3"
exit 1
"""


# Which nodes take unflushed WAL where the server can (a mix: a primary
# streams unflushed WAL to some standbys and not to others; n3, a
# synchronous candidate, and whatever follows it after its promotion, takes
# flushed WAL only).  The setting stays with the node through rewinds and
# rebuilds.
ACCEPTS_UNFLUSHED = {"n1": "on", "n2": "on", "n3": "off", "n4": "on"}

WAL_SEGMENT = 16 << 20


def lsn_int(lsn: str) -> int:
    hi, lo = lsn.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def wal_file_name(tli: int, lsn: int) -> str:
    segno = lsn // WAL_SEGMENT
    per_id = 0x100000000 // WAL_SEGMENT
    return f"{tli:08X}{segno // per_id:08X}{segno % per_id:08X}"


@dataclass(frozen=True)
class TimelineSwitch:
    """One line of a timeline history file: timeline `parent` was left at
    `at` (for the next line's timeline, or the file's own), for `reason`."""
    parent: int
    at: int
    reason: str


def parse_history(text: str) -> list[TimelineSwitch]:
    """The switches of a timeline history file's text, oldest first (the
    server writes each line as parent, tab, switch point, tab, reason)."""
    out = []
    for ln in text.splitlines():
        f = ln.split("\t")
        if len(f) < 2 or not f[0].strip().isdigit():
            continue  # blank or a comment
        out.append(TimelineSwitch(int(f[0]), lsn_int(f[1].strip()), f[2].strip() if len(f) > 2 else ""))
    return out


def first_switch_above(switches: list[TimelineSwitch], tli: int, known: int) -> str | None:
    """The reason of the first switch, in the lineage of timeline `tli`
    (`switches`, its history), to a timeline above `known`: how a node left
    the timelines it knew."""
    for i, sw in enumerate(switches):
        child = switches[i + 1].parent if i + 1 < len(switches) else tli
        if child > known:
            return sw.reason
    return None


def switch_segments_in(history: str, archive: Path) -> list[str]:
    """The names in `archive` of old-timeline segments across a crash
    switch of `history` (a timeline history file's text)."""
    out = []
    for sw in parse_history(history):
        if not sw.reason.startswith("crash recovery"):
            continue
        if sw.at % WAL_SEGMENT == 0:
            continue  # the switch point begins a segment: nothing of it is on the old timeline
        name = wal_file_name(sw.parent, sw.at)
        if (archive / name).exists() and not _finished_by_the_cut_record(archive / name, sw.at):
            out.append(f"{name} (timeline {sw.parent} left at {lsn_text(sw.at)}: {sw.reason})")
    return out


WAL_PAGE = 8192


def _finished_by_the_cut_record(segment: Path, at: int) -> bool:
    """Whether the segment was complete before the crash: the record that
    starts at the switch point (the one the crash cut) runs past the
    segment's end.  Writing it finished the segment, and a finished segment
    is fsynced and marked for archiving at once, so it may reach the archive
    under its full name before the crash, on any server; its bytes past the
    switch point are only the first part of that record, which no reader
    of the old timeline reaches (its history ends at the switch point)."""
    off = at % WAL_SEGMENT
    if off % WAL_PAGE > WAL_PAGE - 4:
        return False  # xl_tot_len itself would cross a page boundary: not judged as finished
    try:
        with segment.open("rb") as f:
            if os.fstat(f.fileno()).st_size != WAL_SEGMENT:
                return False
            f.seek(off)
            tot_len = int.from_bytes(f.read(4), "little")
    except OSError:
        return False
    # the record's bytes on this segment's pages, page headers excluded, are
    # fewer than its length: its end lies in the next segment
    room = 0
    pos = off
    while pos < WAL_SEGMENT:
        page_end = (pos // WAL_PAGE + 1) * WAL_PAGE
        room += page_end - pos
        pos = page_end + 24  # the next page's short header (SizeOfXLogShortPHD)
    return tot_len > room


class HistoryCluster:
    def __init__(self, bin_dir, settings: dict, net: str = "1ms", wal_fsync_ms: float = 1):
        disk = f"fsync={int(wal_fsync_ms * 1000)},match=pg_wal" if wal_fsync_ms else "tmpfs"
        spec = topology.ClusterSpec(
            bin_dir=bin_dir, primary_disk=disk, settings=settings, namespaces=False, disk_mb=2048,
            primary_name="n1",
            standbys=[topology.StandbySpec("n2", sync=True, upstream="n1", net=net, disk=disk),
                      topology.StandbySpec("n3", sync=True, upstream="n1", net=net, disk=disk),
                      topology.StandbySpec("n4", sync=False, upstream="n3", net=net, disk=disk)])
        self.c = topology.Cluster(spec)
        # n1 is a standby too once a failover moved it: its link has the delay
        # (and a proxy a partition can cut) like every other
        from .. import netem

        self.c.primary.net_profile = netem.profile(net)
        self.down: list[str] = []
        self.archive_disk = Disk(f"{self.c.id}-archive", self.c.root / "archive-fs", 4096)
        self.archive = self.archive_disk.mountpoint / "archive"
        self._archive_checked: set = set()  # (primary, segment) found equal

    # --- set-up ----------------------------------------------------------
    def __enter__(self) -> "HistoryCluster":
        self.c.root.mkdir(parents=True, exist_ok=True)
        try:
            self.archive_disk.create()
        except BaseException:
            self.archive_disk.destroy()
            raise
        for d in (self.archive, self.archive / "conflicts", self.archive / "tmp"):
            d.mkdir(parents=True, exist_ok=True)
            chown_to_pg(d)
        script = self.c.root / "archive.sh"
        script.write_text(ARCHIVE_SH.format(dir=self.archive))
        script.chmod(0o755)
        for n in self.c.nodes.values():
            n.conf_extra["archive_command"] = f"{script} %p %f {n.name}"
            if "wal_receiver_accept_unflushed" in self.c.spec.settings:
                n.conf_extra["wal_receiver_accept_unflushed"] = ACCEPTS_UNFLUSHED[n.name]
        self.c.create()
        # The volatile page cache starts now, with everything written so far
        # durable: initdb -N and pg_basebackup -N sync nothing, and a power
        # loss must not take files no server wrote (seen: an empty
        # global/pg_filenode.map after the first failover when the nodes
        # were armed before initdb).
        try:
            for n in reversed(list(self.c.nodes.values())):
                n.stop("fast")
            os.sync()
            for n in self.c.nodes.values():
                faults.arm(n)
                n.start()
            self.c.wait_streaming()
            self.proof = self.prove()
        except BaseException:
            self._destroy()
            raise
        return self

    def prove(self) -> dict:
        """Before the first step: every postmaster runs with the shim's
        volatile page cache, which loses an unsynced write and keeps a synced
        one on the node's file system (power.self_test; its emulated power
        loss also drops every undo log so far, so everything before the first
        step is durable), every WAL fsync pays its delay, and every link its
        round trip (ProofError otherwise)."""
        from .. import power
        from ..proof import ProofError, prove_disk, prove_link, shim_state

        out: dict = {}
        for n in self.c.nodes.values():
            st = shim_state(n.pid())
            if n.extra_env["LD_PRELOAD"] not in st["mapped"] or \
                    st["env"].get("PGWAL_SHIM_VOLATILE_DIR") != n.extra_env["PGWAL_SHIM_VOLATILE_DIR"]:
                raise ProofError(f"{n.name}: the postmaster has not loaded the shim in volatile mode "
                                 f"(mapped {st['mapped']}, env {st['env']})")
            power.self_test(faults.volatile_dir(n), n.datadir, lambda cmd, n=n: n.run_pg(cmd, timeout=60))
            out[n.name] = {"wal_fsync_us": (prove_disk(n).get("probe") or {}).get("fdatasync_us_min"),
                           "volatile": "proved"}
        for s in self.standbys():
            out[s.name]["rtt_ms_min"] = prove_link(s).get("rtt_ms_min")
        return out

    def __exit__(self, *exc) -> None:
        self._destroy()

    def _destroy(self) -> None:
        # the nodes (and their archivers) stop before the archive goes
        try:
            self.c.destroy()
        finally:
            self.archive_disk.destroy()
            shutil.rmtree(self.c.root, ignore_errors=True)

    # --- roles -----------------------------------------------------------
    @property
    def primary(self):
        return self.c.primary

    def node(self, name: str):
        return self.c.nodes[name]

    def live(self) -> list:
        return [n for n in self.c.nodes.values() if n.name not in self.down]

    def standbys(self) -> list:
        return [n for n in self.live() if n.upstream is not None]

    def below(self, node) -> list:
        out, todo = [], [node]
        while todo:
            x = todo.pop()
            for s in self.standbys():
                if s.upstream is x and s not in out:
                    out.append(s)
                    todo.append(s)
        return out

    def state(self, has_uw: bool, has_fw: bool, has_summarize: bool = False):
        from .schedule import State

        fw_on = tuple(s.name for s in self.standbys()
                      if {**self.c.spec.settings, **s.conf_extra}.get("wal_receiver_flush_worker") == "on")
        return State(self.primary.name, {s.name: s.upstream.name for s in self.standbys()}, list(self.down),
                     has_uw, has_fw, self.c.sync_first, fw_on, has_summarize,
                     self.archive_disk.mounted and all(n.disk.mounted for n in self.c.nodes.values()))

    def sync_standby(self) -> str | None:
        """The standby the primary's synchronous commits wait for now."""
        return self.primary.scalar("SELECT application_name FROM pg_stat_replication WHERE sync_state = 'sync' "
                                   "LIMIT 1")

    def make_sync(self, node) -> None:
        """Put a direct standby of the primary first among the synchronous
        candidates, and wait until the primary's commits wait for it."""
        self.c.sync_first = node.name
        self.refresh_sync_names()
        wait_for(lambda: self.sync_standby() == node.name, 60, f"{node.name} to become the synchronous standby",
                 interval=0.2)

    def timeline(self, node=None) -> int:
        """The primary's (or a primary-to-be's) current timeline."""
        n = node or self.primary
        return int(n.scalar("SELECT substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8)"), 16)

    def refresh_sync_names(self) -> None:
        """Every direct standby of the primary is a synchronous candidate."""
        for s in self.standbys():
            s.sync = s.upstream is self.primary
        self.primary.write_node_conf()
        self.primary.sql("SELECT pg_reload_conf()")

    # --- links -----------------------------------------------------------
    def relink(self, node, upstream) -> None:
        """Point a standby's link (its delay proxy) at another upstream."""
        node.upstream = upstream
        node.stop_proxy()
        if node.net_profile.proxy:
            from .. import netem

            node.proxy = netem.Proxy(node.net_profile, f"{upstream.addr_for(node)}:{upstream.port}",
                                     netns=node.netns, tag=f"{self.c.id}-{node.name}").start()
            self.c.save_state()
        node.write_node_conf()

    def repoint(self, node, upstream) -> None:
        """A running standby follows another upstream (primary_conninfo reloads)."""
        self.relink(node, upstream)
        node.sql("SELECT pg_reload_conf()")

    # --- operations ------------------------------------------------------
    def become_standby(self, node) -> None:
        """A stopped node's data directory made a standby's: standby.signal,
        and no ALTER SYSTEM settings (pg_rewind and a base backup copy the
        source's)."""
        for name, text in (("standby.signal", None), ("postgresql.auto.conf", "")):
            p = node.datadir / name
            if text is None:
                p.touch()
            else:
                p.write_text(text)
            chown_to_pg(p)

    def stop(self, node) -> None:
        node.stop("fast", timeout=60)
        if node.pid() is not None and Path(f"/proc/{node.pid()}").exists():
            raise LabError(f"{node.name} did not stop")

    @staticmethod
    def history(node, tli: int) -> list[TimelineSwitch]:
        """The switches of `node`'s history file of timeline `tli` (none for
        timeline 1, or a file it does not have)."""
        return parse_history(node.scalar("SELECT pg_read_file(%s, 0, 1000000, true)",
                                         (f"pg_wal/{tli:08X}.history",)) or "")

    def fork_point(self, new_primary) -> tuple[int, int] | None:
        """(parent timeline, switch point) of the new primary's newest history entry."""
        switches = self.history(new_primary, self.timeline(new_primary))
        return (switches[-1].parent, switches[-1].at) if switches else None

    def replayed(self, node) -> int | None:
        try:
            lsn = node.scalar("SELECT pg_last_wal_replay_lsn()::text")
        except Exception:  # noqa: BLE001 - not running: decided from its control file by pg_rewind
            return None
        return lsn_int(lsn) if lsn else None

    def rewind(self, node, source) -> str:
        """pg_rewind a stopped node against `source`; it then is a standby."""
        out = faults.rewind(node, source)
        self.become_standby(node)
        return out

    def promote(self, node, crash_after_ms: int | str | None = None, crash=None) -> dict:
        """Promote a standby whose primary is gone; every standby of the old
        primary follows it, rewound first where it replayed past the fork.
        With `crash_after_ms`, `crash()` (a power loss and restart of the
        node) strikes that long after the promotion was requested, while it
        runs, or ("history") the moment the new timeline's history file
        appears in its pg_wal, before its end-of-recovery record; a node that
        comes back still a standby is promoted again."""
        old = self.primary
        node.stop_proxy()
        t0 = time.monotonic()
        extra: dict = {}
        histories = set((node.datadir / "pg_wal").glob("*.history"))
        # a promotion must choose a timeline above every one the node knows
        # of (PostgreSQL's findNewestTimeLine() + 1); one that comes out on a
        # timeline it had is a primary of the old timeline, a fork
        known = max([int(h.stem, 16) for h in histories], default=1)
        if crash_after_ms is None:
            faults.promote(node)
        else:
            # the startup process writes the history file and then the
            # end-of-recovery record, a few milliseconds apart: it is stopped
            # the moment the file appears, the rest of the node with the
            # power loss (a crash first lists the node's processes, which
            # takes longer than that window).  The others running on for
            # those milliseconds is a schedule the server must take anyway.
            startup = node.scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'startup'") \
                if crash_after_ms == "history" else None
            node.run_pg([node.bin("pg_ctl"), "-D", node.datadir, "-W", "promote"], timeout=30)
            if crash_after_ms == "history":
                t1 = time.monotonic()
                while not set((node.datadir / "pg_wal").glob("*.history")) - histories:
                    if time.monotonic() - t1 > 30:
                        raise LabError(f"{node.name}: no new timeline history file 30 s after its promotion "
                                       "was requested")
                    time.sleep(0.0002)
                if startup:
                    faults.signal_all([startup], signal.SIGSTOP)
                waited_ms = round((time.monotonic() - t1) * 1000, 1)
                extra = crash()
                extra["history_seen_after_ms"] = waited_ms
            else:
                time.sleep(crash_after_ms / 1000)
                extra = crash()
            extra["promoted_before_crash"] = not node.scalar("SELECT pg_is_in_recovery()")
            if not extra["promoted_before_crash"]:
                faults.promote(node)
        extra["timeline_known"] = known
        extra["timeline_after"] = tli = self.timeline(node)
        extra["timeline_entered_by"] = first_switch_above(self.history(node, tli), tli, known)
        node.upstream = None
        self.c.primary = node
        node.sync = False
        self.down.append(old.name)
        fork = self.fork_point(node)
        rewound = []
        movers = [s for s in self.standbys() if s.upstream is old]
        # Decided per mover, while nothing new reaches it (its upstream is
        # dead): one that replayed past the fork is stopped and rewound, with
        # every node below it that did too (they got their WAL from it, and
        # stay on the old timeline while it is down).  Below a mover that is
        # not past the fork nothing is.  Nodes below the promoted node follow
        # its timeline switch by cascade and are never rewound: one that
        # could not follow would be a server bug, and liveness says so.
        for m in movers:
            self.relink(m, node)  # written now, in effect at its reload or start
            pos = self.replayed(m)
            if not (fork and pos is not None and pos > fork[1]):
                m.sql("SELECT pg_reload_conf()")
                continue
            group = [m] + [d for d in self.below(m) if (self.replayed(d) or 0) > fork[1]]
            for g in group:
                self.stop(g)
            for g in group:
                self.rewind(g, node)
            for g in group:
                g.start()
            rewound += [g.name for g in group]
        self.refresh_sync_names()
        return {"promote_s": round(time.monotonic() - t0, 3), "rewound": rewound,
                "fork": f"{fork[0]}@{fork[1]:X}" if fork else None, **extra}

    def rejoin(self, name: str) -> str:
        """A former primary rewound against the primary and started as its standby."""
        node = self.node(name)
        out = self.rewind(node, self.primary)
        self._start_rejoined(node)
        return out

    def _start_rejoined(self, node) -> None:
        """A former primary, made a standby of the primary, started as one."""
        self.relink(node, self.primary)
        faults.arm(node)
        self.down.remove(node.name)
        node.start()
        self.refresh_sync_names()

    def rejoin_cut(self, name: str, moment_ms: int) -> dict:
        """A rejoin whose pg_rewind loses power `moment_ms` after it started
        (faults.rewind_cut), followed by what a cluster manager does once the
        host is back: pg_rewind again.  Where that refuses, the node is
        rebuilt by a base backup of the primary, as PostgreSQL's documentation
        says to after a failed rewind.  Either way the node must then
        converge with the primary: a second pg_rewind that reports success on
        a half-rewound directory and leaves it diverged fails the history."""
        node = self.node(name)
        rec = faults.rewind_cut(node, self.primary, moment_ms)
        if rec["rewind_ended_before_cut"] and rec["rewind_exit"] != 0:
            raise LabError(f"pg_rewind of {node.name} failed before the power loss: {rec['rewind_last_line']}")
        # run again also when it had ended: the host lost power before
        # whoever ran it could record that, and before the node started
        faults.drop_garbled_lock_file(node)  # as before any start after a power loss
        try:
            rec["rewind"] = self.rewind(node, self.primary)
            rec["after_cut"] = "rewound again"
        except LabError as e:
            rec["second_rewind_refused"] = str(e)[-600:]
            rec["after_cut"] = "base backup of the primary"
            self._base_backup(node, self.primary, "stream")
        self._start_rejoined(node)
        return rec

    def rebuild(self, node, source, wal_method: str) -> None:
        """Replace a standby by a base backup of another standby; it follows
        its upstream as before."""
        self.stop(node)
        self._base_backup(node, source, wal_method)
        faults.arm(node)
        node.start()

    def _base_backup(self, node, source, wal_method: str) -> None:
        """Replace a stopped node's data directory by a base backup of
        `source`, a standby's (standby.signal, no ALTER SYSTEM settings)."""
        shutil.rmtree(node.datadir)
        node.datadir.mkdir(mode=0o700)
        chown_to_pg(node.datadir)
        # without the volatile page cache: what the backup wrote is on disk
        # (os.sync) before the node's cache starts anew (faults.arm)
        run([node.bin("pg_basebackup"), "-D", node.datadir, "-h", source.sockdir, "-p", source.port,
             "-U", "postgres", "-X", wal_method, "-c", "fast", "-N"], timeout=600, as_pg=True,
            env=node.disk_profile.env() or None)
        self.become_standby(node)
        os.sync()

    def archive_against_primary(self) -> tuple[int, list[str]]:
        """Compare every archived segment the primary holds complete (its
        whole range flushed on the primary's timeline history) with the
        primary's copy: (how many compared, names whose bytes differ).  A
        difference is WAL in the archive the primary does not have: WAL it
        lost.  A segment the primary has recycled meanwhile is skipped (its
        archiver archived it first, and the conflict check saw that copy)."""
        p = self.primary
        ends = self._timeline_ends(p)
        compared, differ = 0, []
        for a in sorted(self.archive.iterdir()):
            if not a.is_file() or len(a.name) != 24 or not all(ch in "0123456789ABCDEF" for ch in a.name):
                continue
            tli, seg = int(a.name[:8], 16), (int(a.name[8:16], 16) << 8) | int(a.name[16:], 16)
            end = ends.get(tli)
            if end is None or (seg + 1) * WAL_SEGMENT > end:
                continue  # not a timeline of the primary's history, or not complete there
            key = (p.name, a.name)
            if key in self._archive_checked:
                continue
            mine = p.datadir / "pg_wal" / a.name
            try:
                before = mine.stat().st_ino
                same = filecmp.cmp(mine, a, shallow=False)
                still = mine.stat().st_ino == before
            except FileNotFoundError:
                continue
            if not still:
                continue  # recycled (renamed and rewritten) while compared
            compared += 1
            if same:
                self._archive_checked.add(key)
            else:
                differ.append(a.name)
        return compared, differ

    def _timeline_ends(self, p) -> dict[int, int]:
        """{timeline: end of its WAL} along the primary's history: each
        ancestor's switch point, the current timeline's flush position."""
        tli = self.timeline(p)
        ends = {tli: lsn_int(p.scalar("SELECT pg_current_wal_flush_lsn()::text"))}
        for sw in self.history(p, tli):
            ends[sw.parent] = sw.at
        return ends

    def history_mismatches(self) -> list[str]:
        """Timeline history files of the primary's lineage (its current
        timeline and every ancestor) that a live node or the archive holds
        with other bytes than the primary.  A history file is copied verbatim
        to every server that follows its timeline, so another copy under the
        same name is another timeline with the same ID: two lineages a tool
        comparing timeline IDs would take for one."""
        p = self.primary
        lineage = sorted(t for t in self._timeline_ends(p) if t > 1)
        out = []
        for tli in lineage:
            name = f"{tli:08X}.history"
            mine = p.datadir / "pg_wal" / name
            if not mine.exists():
                continue  # an ancestor's file a base backup left out: nothing to compare with
            want = mine.read_bytes()
            copies = [(n.name, n.datadir / "pg_wal" / name) for n in self.live() if n is not p]
            copies.append(("the archive", self.archive / name))
            for who, path in copies:
                try:
                    got = path.read_bytes()
                except FileNotFoundError:
                    continue  # a standby fetches a history file only when it follows
                if got != want:
                    out.append(f"{who} holds another {name} than the primary")
        return out

    def archive_switch_segments(self) -> list[str]:
        """Segments of an old timeline archived under their full name across
        the point where a crash switch left that timeline.  A crash switch
        archives that segment as .partial only: WAL beyond the switch point
        may be WAL the primary lost.  (A promotion is not judged: in stock
        PostgreSQL the former primary may have archived its whole segment
        before it went down.)"""
        p = self.primary
        tli = self.timeline(p)
        text = p.scalar("SELECT pg_read_file(%s, 0, 1000000, true)", (f"pg_wal/{tli:08X}.history",)) or ""
        return switch_segments_in(text, self.archive)

    def archive_conflicts(self) -> list[str]:
        return sorted(p.name for p in (self.archive / "conflicts").iterdir())

    def archived(self) -> int:
        return sum(1 for p in self.archive.iterdir() if p.is_file())

    def keep_logs(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for n in self.c.nodes.values():
            if n.logfile.exists():
                shutil.copy(n.logfile, dest / f"{n.name}.log")
        conflicts = self.archive / "conflicts"
        if any(conflicts.iterdir()):
            shutil.copytree(conflicts, dest / "archive-conflicts", dirs_exist_ok=True)
        os.sync()


def wait_accepting(node, timeout: float) -> float:
    """Seconds until a node accepts connections (LabError after `timeout`)."""
    t0 = time.monotonic()
    wait_for(lambda: faults._accepts(node), timeout, f"{node.name} to accept connections", interval=0.05)
    return time.monotonic() - t0
