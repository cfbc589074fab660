"""audit-receiver: `pgwal receive --ack receive|write|flush` as the primary's
only synchronous standby; what it acknowledged must be in its segment files
after it crashes.

One server whose synchronous_standby_names names the receiver; the receiver
writes into a directory under a volatile page cache (the shim, as the
audit's nodes: what was not fsynced is lost at an emulated power loss).  Each
cycle starts a WAL segment, (re)starts the receiver, runs the ledger writers
(audit/ledger.py) at the level the mode serves for `load_s` and at least
until the first acknowledgement (a receiver that acknowledges nothing for a
minute is a violation), then crashes the receiver:

  receiver-kill   SIGKILL
  receiver-power  SIGKILL, then its unsynced writes dropped

Right after the crash, before the receiver starts again and fetches the lost
tail anew, pg_waldump reads the directory from the cycle's first segment on,
and every commit a writer saw acknowledged before the crash must have its
commit record there (by xid; COMMIT PREPARED by the prepared xid).  Then the
receiver restarts, the commits that waited for it finish, and the next cycle
begins.

Modes and what they promise (crates/README.md, `pgwal receive`):
  flush    level on: acknowledged = fsynced; survives kill and power
  write    level remote_write: acknowledged = written; survives kill only
           (power is a control: a status interval's worth of WAL is unsynced)
  receive  level remote_write, reported on receipt before the write; survives
           nothing it promises (power is a control)
"""
from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .. import power, topology
from ..audit.ledger import Load, prepare_cycle
from ..proof import ProofError, shim_state
from ..util import LabError, pgwal_binary, wait_for
from . import Context, as_list

NAME = "audit-receiver"
MODES = ("flush", "write", "receive")
FAULTS = ("receiver-kill", "receiver-power")
LEVEL = {"flush": "on", "write": "remote_write", "receive": "remote_write"}
APP = "pgwal_receive"
FIRST_ACK_TIMEOUT_S = 60.0
DEFAULTS = {"cycles": 100, "modes": list(MODES), "faults": list(FAULTS), "load_s": [0.3, 1.5], "seed": 1}
SMOKE = {"cycles": 2, "load_s": [0.3, 0.8]}
SETTINGS = {"max_prepared_transactions": 20, "log_min_messages": "warning", "shared_buffers": "128MB",
            "wal_keep_size": "256MB", "max_wal_size": "256MB"}


def promised(mode: str, fault: str) -> bool:
    return mode == "flush" or (mode == "write" and fault == "receiver-kill")


def is_control(mode: str, fault: str) -> bool:
    return fault == "receiver-power" and mode in ("write", "receive")


class Receiver:
    def __init__(self, primary, root: Path, mode: str):
        self.primary = primary
        self.mode = mode
        self.dir = root / "mnt" / "receiver"
        self.logs = root / "mnt" / "receiver-undo"
        self.stderr = root / "receiver.stderr"
        self.dir.mkdir(parents=True, exist_ok=True)
        power.prepare(self.logs)
        self.proc: subprocess.Popen | None = None
        self.env = dict(os.environ, **power.volatile_env(self.logs, self.dir))
        # the volatile page cache in effect on this directory (raises if not)
        power.self_test(self.logs, self.dir, lambda cmd: subprocess.run(cmd, env=self.env, check=True,
                                                                           timeout=60))
        self.proved = False

    def start(self) -> None:
        env = self.env
        conn = f"{self.primary.conninfo()} application_name={APP}"
        with open(self.stderr, "ab") as err:
            self.proc = subprocess.Popen([str(pgwal_binary()), "-d", conn, "receive", "-D", str(self.dir),
                                          "--ack", self.mode, "--status-interval", "1"],
                                         stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
        wait_for(lambda: self.primary.scalar(
            "SELECT count(*) FROM pg_stat_replication WHERE application_name = %s AND state = 'streaming' "
            "AND sync_state = 'sync'", (APP,)) == 1, 60, "the receiver to stream as the synchronous standby")
        if not self.proved:
            st = shim_state(self.proc.pid)
            if not st["mapped"] or st["env"].get("PGWAL_SHIM_VOLATILE_DIR") != str(self.logs):
                raise ProofError(f"the receiver has not loaded the shim in volatile mode ({st})")
            self.proved = True

    def prune(self) -> None:
        """Keep only the newest segment file, where the receiver resumes (a
        cycle's WAL would fill the disk in a few hundred cycles otherwise)."""
        files = sorted(f for f in self.dir.iterdir() if len(f.name.removesuffix(".partial")) == 24)
        for f in files[:-1]:
            f.unlink()

    def crash(self, power_loss: bool) -> dict:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None
        if not power_loss:
            return {}
        stats = power.undo(self.logs, [self.dir]).asdict()
        power.prepare(self.logs)
        return stats

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


COMMIT = re.compile(r"tx:\s+(\d+),.*desc: COMMIT(?:_PREPARED (\d+):)?")


def committed_xids(bin_dir: Path, wal_dir: Path, start_lsn: str) -> tuple[set[int], str]:
    """The xids whose commit records pg_waldump finds in the receiver's files
    from `start_lsn` on (a .partial segment read as the segment it is), and
    pg_waldump's last words (where the WAL ended)."""
    with tempfile.TemporaryDirectory(prefix="pgwal-audit-recv-") as tmp:
        for f in wal_dir.iterdir():
            name = f.name.removesuffix(".partial")
            if len(name) == 24 and all(c in "0123456789ABCDEF" for c in name):
                shutil.copyfile(f, Path(tmp) / name)
        p = subprocess.run([str(bin_dir / "pg_waldump"), "-p", tmp, "-s", start_lsn],
                           capture_output=True, text=True, timeout=300)
    xids = set()
    for m in COMMIT.finditer(p.stdout):
        xids.add(int(m.group(2)) if m.group(2) else int(m.group(1)))
    return xids, (p.stderr.strip().splitlines() or [""])[-1]


def run_cycle(ctx: Context, primary, recv: Receiver, cycle: int, mode: str, fault: str, load_s: float) -> dict:
    if recv.proc is None:
        recv.start()
    with primary.connect() as c:
        c.execute("SET synchronous_commit = local")
        prepare_cycle(c, cycle)
        c.execute("SELECT pg_switch_wal()")
        start = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
    load = Load(primary.conninfo(), cycle, {"synchronous_commit": LEVEL[mode]}, [])
    load.start()
    time.sleep(load_s)
    # a crash before the first acknowledgement tests nothing: on a loaded
    # machine the writers' first commits can take longer than load_s
    waited = time.monotonic()
    first_ack = load.wait_for_ack(FIRST_ACK_TIMEOUT_S)
    waited = time.monotonic() - waited
    load.fault_at = time.monotonic()
    undone = recv.crash(power_loss=fault == "receiver-power")
    acked = [(w.kind, x) for w in load.writers for x in w.acked if x.t < load.fault_at]
    xids, ended = committed_xids(ctx.bin_dir, recv.dir, start)
    lost = [f"{kind} seq {x.seq} (xid {x.txid})" for kind, x in acked if (x.txid & 0xFFFFFFFF) not in xids]
    recv.prune()
    recv.start()  # the commits waiting for it finish; it resumes and fetches the lost tail anew
    load.finish()
    rec = {"cycle": cycle, "mode": mode, "fault": fault, "load_s": round(load_s, 3), "undone": undone,
           "acked_before_fault": len(acked), "acked_lost": len(lost), "lost_examples": lost[:5],
           "waited_for_first_ack_s": round(waited, 3),
           "commit_records": len(xids), "waldump_end": ended[:200],
           "writer_errors": [w.error for w in load.writers if w.error],
           "void": any(w.error for w in load.writers)}
    rec["violations"] = ([f"{len(lost)} acknowledged commits missing from the receiver's files: "
                          f"{'; '.join(lost[:5])}"] if lost and promised(mode, fault) else [])
    if not first_ack and not rec["void"]:
        # the receiver acknowledged nothing for FIRST_ACK_TIMEOUT_S: a liveness failure
        rec["violations"].append(f"no commit acknowledged within {FIRST_ACK_TIMEOUT_S:.0f} s of the load's start")
    return rec


def run(ctx: Context, params: dict) -> list[dict]:
    modes = [str(m) for m in as_list(params["modes"])]
    fault_list = [str(f) for f in as_list(params["faults"])]
    for m in modes:
        if m not in MODES:
            raise LabError(f"unknown mode {m!r} (known: {', '.join(MODES)})")
    for f in fault_list:
        if f not in FAULTS:
            raise LabError(f"unknown fault {f!r} (known: {', '.join(FAULTS)})")
    lo, hi = (float(x) for x in as_list(params["load_s"]))
    rng = random.Random(int(params["seed"]))
    pgwal_binary()
    spec = topology.ClusterSpec(bin_dir=ctx.bin_dir, settings=dict(SETTINGS), namespaces=False, disk_mb=2048)
    cluster = topology.Cluster(spec)
    schedule = [(f, m) for _ in range(int(params["cycles"])) for f in fault_list for m in modes]
    if ctx.set_total:
        ctx.set_total(len(schedule), None)
    records = []
    with cluster:
        primary = cluster.primary
        common = dict(ctx.common, server_version=cluster.server_version(), params=params,
                      pgwal=str(pgwal_binary()))
        receivers: dict[str, Receiver] = {}
        try:
            primary.alter_system({"synchronous_standby_names": APP})
            wait_for(lambda: primary.scalar("SHOW synchronous_standby_names") == APP, 30,
                     "synchronous_standby_names")
            for i, (fault, mode) in enumerate(schedule):
                if ctx.deadline and time.monotonic() > ctx.deadline - 60:
                    ctx.log(f"audit-receiver: time limit reached after {i} of {len(schedule)} cycles")
                    break
                # one receiver (and directory) per mode: a mode's directory holds only what it acknowledged
                for m, r in receivers.items():
                    if m != mode:
                        r.stop()
                if mode not in receivers:
                    receivers[mode] = Receiver(primary, primary.root / f"recv-{mode}", mode)
                recv = receivers[mode]
                try:
                    rec = run_cycle(ctx, primary, recv, i + 1, mode, fault, rng.uniform(lo, hi))
                except LabError as e:
                    tail = recv.stderr.read_text(errors="replace")[-1500:] if recv.stderr.exists() else ""
                    raise LabError(f"cycle {i + 1} ({fault}, --ack {mode}): {e}\n--- receiver:\n{tail}\n"
                                   f"--- server log:\n{primary.log_tail(30)}") from None
                rec.update(common, scenario=NAME, group=fault, variant=mode, run_id=ctx.run_id)
                ctx.store.append(rec)
                records.append(rec)
                if ctx.progress:
                    ctx.progress(f"cycle {i + 1}: {fault} --ack {mode}: {rec['acked_before_fault']} acked, "
                                 f"{rec['acked_lost']} missing" + (f" VIOLATION {rec['violations']}"
                                                                   if rec["violations"] else ""))
        finally:
            for r in receivers.values():
                r.stop()
    return records


def failures(records: list[dict]) -> str | None:
    mine = [r for r in records if r.get("scenario") == NAME]
    bad = [f"cycle {r['cycle']} {r['fault']} --ack {r['mode']}: {'; '.join(r['violations'])}"
           for r in mine if r["violations"]]
    bad += [f"cycle {r['cycle']}: {r['writer_errors']}" for r in mine if r.get("void")]
    return "; ".join(bad[:10]) if bad else None
