"""An existing cluster, reached only by its DSNs (`pgwal-lab run ... --cluster FILE`).

For primaries and standbys on real, separate machines: the same method
(interleaved variants, settings switched with ALTER SYSTEM + reload and
verified, catch-up waits, checkpoints, statistics, reports) without
namespaces, proxies or the fsync shim.  The lab changes only the settings
the file allows, remembers what postgresql.auto.conf held for each before
its first change, and puts that back when the scenario ends, fails or is
interrupted (Ctrl-C, SIGTERM).  The workload's tables are created (and
pgbench's dropped first) in the DSNs' database: give the lab a database of
its own.

    # cluster.toml
    [primary]
    dsn = "host=db1 port=5432 user=postgres dbname=pgwal_lab"

    [[standbys]]
    name = "s1"               # its application_name in pg_stat_replication
    dsn = "host=db2 port=5432 user=postgres dbname=pgwal_lab"
    sync = true               # must be a synchronous standby (default true)

    [client]
    bin_dir = "/usr/lib/postgresql/18/bin"   # pgbench on this machine

    [settings]
    may_change = ["synchronous_commit", "wal_receiver_flush_worker", "wal_receiver_reply_events"]
    checkpoint = true         # CHECKPOINT every node before each run

What cannot be read from another machine is not reported: walsender and
walreceiver CPU and I/O (from /proc) stay empty.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import netem
from .topology import ReplicationSet, SqlNode, q
from .util import LabError

DEFAULT_MAY_CHANGE = ["synchronous_commit"]


@dataclass
class StandbyConf:
    name: str
    dsn: str
    sync: bool = True


@dataclass
class ClusterConf:
    path: Path
    primary_dsn: str
    standbys: list[StandbyConf]
    bin_dir: Path
    may_change: list[str] = field(default_factory=lambda: list(DEFAULT_MAY_CHANGE))
    checkpoint: bool = True


def _dsn(where: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise LabError(f"{where}: dsn must be a connection string")
    try:
        conninfo_to_dict(value)
    except psycopg.ProgrammingError as e:
        raise LabError(f"{where}: bad dsn: {e}") from None
    return value


def load(path: str | Path) -> ClusterConf:
    """Read and check a cluster file; every mistake is a LabError naming it."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise LabError(f"cannot read {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise LabError(f"{path}: {e}") from None
    unknown = set(data) - {"primary", "standbys", "client", "settings"}
    if unknown:
        raise LabError(f"{path}: unknown sections {sorted(unknown)} (primary, standbys, client, settings)")
    primary = data.get("primary") or {}
    if set(primary) - {"dsn"}:
        raise LabError(f"{path}: [primary] takes only dsn")
    pdsn = _dsn(f"{path} [primary]", primary.get("dsn"))
    standbys = []
    for i, s in enumerate(data.get("standbys") or []):
        where = f"{path} [[standbys]] #{i + 1}"
        if set(s) - {"name", "dsn", "sync"}:
            raise LabError(f"{where}: takes name, dsn and sync")
        if not isinstance(s.get("name"), str) or not s["name"]:
            raise LabError(f"{where}: name (its application_name) is required")
        if not isinstance(s.get("sync", True), bool):
            raise LabError(f"{where}: sync is true or false")
        standbys.append(StandbyConf(s["name"], _dsn(where, s.get("dsn")), s.get("sync", True)))
    if not standbys:
        raise LabError(f"{path}: at least one [[standbys]] entry is needed")
    if len({s.name for s in standbys}) != len(standbys):
        raise LabError(f"{path}: standby names must differ")
    client = data.get("client") or {}
    if set(client) - {"bin_dir"} or not isinstance(client.get("bin_dir"), str):
        raise LabError(f"{path}: [client] needs bin_dir (where pgbench is) and nothing else")
    bin_dir = Path(client["bin_dir"])
    if not (bin_dir / "pgbench").exists():
        raise LabError(f"{path}: no pgbench in {bin_dir}")
    settings = data.get("settings") or {}
    if set(settings) - {"may_change", "checkpoint"}:
        raise LabError(f"{path}: [settings] takes may_change and checkpoint")
    may = settings.get("may_change", DEFAULT_MAY_CHANGE)
    if not isinstance(may, list) or not all(isinstance(x, str) and x.isidentifier() for x in may):
        raise LabError(f"{path}: may_change is a list of setting names")
    if not isinstance(settings.get("checkpoint", True), bool):
        raise LabError(f"{path}: checkpoint is true or false")
    return ClusterConf(path, pdsn, standbys, bin_dir, list(may), settings.get("checkpoint", True))


class ExternalNode(SqlNode):
    """A server of an existing cluster, by DSN."""

    def __init__(self, cluster: "ExternalCluster", name: str, dsn: str, upstream: "ExternalNode | None",
                 sync: bool = False):
        self.cluster = cluster
        self.name = name
        self.dsn = dsn
        self.upstream = upstream
        self.sync = sync
        self.running = True
        self.proxy = None
        # the lab adds no delay to a real link
        self.net_profile = netem.profile("none")
        self.saved: dict[str, str | None] = {}  # auto.conf value before the lab's first change

    def conninfo(self, dbname: str = "postgres") -> str:
        # the DSN's own database; `dbname` only names the lab clusters' default
        return self.dsn

    def pgbench_target(self) -> list[str]:
        return [make_conninfo(self.dsn)]

    def alter_system(self, settings: dict) -> None:
        refused = [k for k in settings if k not in self.cluster.conf.may_change]
        if refused:
            raise LabError(f"{self.name}: the cluster file does not allow changing {', '.join(refused)} "
                           f"(add it to [settings] may_change in {self.cluster.conf.path})")
        with self.connect() as c:
            for k, v in settings.items():
                if k not in self.saved:
                    try:
                        row = c.execute("SELECT setting FROM pg_file_settings WHERE name = %s AND sourcefile "
                                        "LIKE '%%postgresql.auto.conf' ORDER BY seqno DESC LIMIT 1",
                                        (k,)).fetchone()
                    except psycopg.Error as e:
                        raise LabError(f"{self.name}: cannot read pg_file_settings to remember {k} before "
                                       f"changing it (the role needs pg_read_all_settings): {e}") from None
                    self.saved[k] = row[0] if row else None
                c.execute(f"ALTER SYSTEM SET {k} = {q(v)}")
            c.execute("SELECT pg_reload_conf()")

    def restore(self) -> list[str]:
        """Put back what postgresql.auto.conf held; returns what was restored."""
        if not self.saved:
            return []
        done = []
        with self.connect() as c:
            for k, v in self.saved.items():
                c.execute(f"ALTER SYSTEM RESET {k}" if v is None else f"ALTER SYSTEM SET {k} = {q(v)}")
                done.append(f"{self.name}: {k} " + ("reset" if v is None else f"= {v}"))
            c.execute("SELECT pg_reload_conf()")
        self.saved.clear()
        return done


@dataclass
class ExternalSpec:
    bin_dir: Path


class ExternalCluster(ReplicationSet):
    """A user's primary and standbys.  As a context manager it checks the
    topology on entry and restores changed settings on exit."""

    local_processes = False
    use_ns = False

    def __init__(self, conf: ClusterConf, log=print):
        self.conf = conf
        self.spec = ExternalSpec(conf.bin_dir)
        self.log = log
        self.primary = ExternalNode(self, "primary", conf.primary_dsn, None)
        self.nodes = {"primary": self.primary}
        for s in conf.standbys:
            if s.name == "primary":
                raise LabError(f"{conf.path}: a standby may not be called 'primary'")
            self.nodes[s.name] = ExternalNode(self, s.name, s.dsn, self.primary, s.sync)

    def check(self) -> dict:
        """The cluster is what the file says: a primary streaming to each
        standby under its name, synchronous where the file says so."""
        try:
            if self.primary.scalar("SELECT pg_is_in_recovery()"):
                raise LabError(f"{self.conf.path}: the [primary] DSN reaches a server in recovery")
            for s in self.standbys:
                if not s.scalar("SELECT pg_is_in_recovery()"):
                    raise LabError(f"{s.name}: the DSN reaches a server that is not in recovery")
            rows = {r[0]: (r[1], r[2]) for r in self.primary.sql(
                "SELECT application_name, state, sync_state FROM pg_stat_replication")}
        except psycopg.Error as e:
            raise LabError(f"cannot query the cluster of {self.conf.path}: {e}") from None
        for s in self.standbys:
            state, sync_state = rows.get(s.name, (None, None))
            if state != "streaming":
                raise LabError(f"{s.name}: not streaming from the primary (pg_stat_replication has "
                               f"{sorted(rows) or 'no standbys'})")
            if s.sync and sync_state not in ("sync", "quorum"):
                raise LabError(f"{s.name}: the file says sync, the primary reports it as {sync_state} "
                               f"(synchronous_standby_names)")
        return {"standbys": {n: {"state": st, "sync_state": ss} for n, (st, ss) in rows.items()}}

    def prove(self) -> dict:
        """No emulation to prove; the build and topology as the servers report them."""
        from . import proof

        versions = {n.name: n.scalar("SHOW server_version") for n in self.nodes.values()}
        # the standbys' own settings that decide what the levels wait for
        standby_settings = {s.name: dict(s.sql("SELECT name, setting FROM pg_settings WHERE name IN "
                                               "('wal_receiver_flush_worker', 'wal_receiver_reply_events', "
                                               "'wal_receiver_status_interval')"))
                            for s in self.standbys}
        levels = proof.server_levels(self.primary)
        topo = self.check()
        p = {"external": True, "cluster_file": str(self.conf.path),
             "build": {"server_version": versions["primary"], "patched": "remote_receive" in levels,
                       "versions": versions},
             "replication": topo["standbys"], "standby_settings": standby_settings, "nodes": {}}
        return p

    def restore(self) -> list[str]:
        done, errors = [], []
        for n in self.nodes.values():
            try:
                done += n.restore()
            except psycopg.Error as e:
                errors.append(f"{n.name}: {e}")
        if errors:
            raise LabError("could not restore settings: " + "; ".join(errors))
        return done

    def __enter__(self) -> "ExternalCluster":
        self.check()
        return self

    def __exit__(self, *exc) -> None:
        done = self.restore()
        if done:
            self.log("restored settings: " + "; ".join(done))
