"""Cluster topology: a primary and N standbys (sync or async, optionally
cascading), created from a given PostgreSQL bin directory.

When root, every node lives in its own network namespace
(`pgwal-<cluster>-<node>`); each standby is joined to its upstream by a veth
pair with addresses 10.213.<standby index>.1 (upstream side) and .2
(standby side) that exist only inside those namespaces.  Otherwise every
node listens on 127.0.0.1 with its own port.  Control connections (psycopg,
pgbench) use each node's Unix socket, which works across network
namespaces.  Servers run as the unprivileged user from tools/as-user.

A standby's link to its upstream may carry a delay proxy (netem.py); its
disk a latency profile (disk.py).  Every resource is recorded in a state
file so that `pgwal-lab clean` can remove leftovers of a crashed run.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from . import disk as diskmod
from . import netem
from .util import PREFIX, LabError, chown_to_pg, is_root, run, state_dir, wait_for, workdir

SUBNET = "10.213"  # only ever configured inside the lab's own namespaces

BASE_SETTINGS = {
    "max_connections": 300,
    "shared_buffers": "256MB",
    "max_wal_size": "2GB",
    "min_wal_size": "256MB",
    "checkpoint_timeout": "30min",
    "wal_level": "replica",
    "max_wal_senders": 10,
    "max_replication_slots": 10,
    "wal_keep_size": "512MB",
    "hot_standby": "on",
    "hot_standby_feedback": "off",
    "wal_receiver_status_interval": "1s",
    "track_io_timing": "on",
    "logging_collector": "off",
    "log_min_messages": "warning",
    "log_checkpoints": "on",
    "synchronous_commit": "on",
}


@dataclass
class StandbySpec:
    name: str
    sync: bool = True
    upstream: str = "primary"  # another standby's name for cascading
    disk: str = "tmpfs"
    net: str = "none"


@dataclass
class ClusterSpec:
    bin_dir: Path
    standbys: list[StandbySpec] = field(default_factory=list)
    primary_disk: str = "tmpfs"
    settings: dict = field(default_factory=dict)
    sync_method: str = "FIRST"  # FIRST (priority) or ANY (quorum)
    num_sync: int = 1
    namespaces: bool | None = None  # None: when root
    disk_mb: int = 3072
    primary_name: str = "primary"  # the history explorer names nodes by identity, not role


def server_settings_sample(bin_dir) -> str:
    """The postgresql.conf.sample of the server in bin_dir ('' if not found)."""
    try:
        share = run([str(Path(bin_dir) / "pg_config"), "--sharedir"], timeout=30).stdout.strip()
        return (Path(share) / "postgresql.conf.sample").read_text()
    except (LabError, OSError):
        return ""


def knows_setting(bin_dir, name: str) -> bool:
    """Whether the server in bin_dir has the setting `name` (from its
    postgresql.conf.sample, so without starting it)."""
    return name in server_settings_sample(bin_dir)


def q(v) -> str:
    if isinstance(v, (int, float)):
        return str(v)
    return "'" + str(v).replace("'", "''") + "'"


class SqlNode:
    """What the method needs of any node, lab-made or a user's: SQL over
    `conninfo()`, settings changes, and how pgbench reaches it."""

    name: str
    upstream: "SqlNode | None"
    running: bool = True

    def conninfo(self, dbname: str = "postgres") -> str:
        raise NotImplementedError

    def pgbench_target(self) -> list[str]:
        """pgbench's connection arguments, the database included."""
        raise NotImplementedError

    @property
    def is_primary(self) -> bool:
        return self.upstream is None

    def connect(self, dbname: str = "postgres", autocommit: bool = True, **kw) -> psycopg.Connection:
        return psycopg.connect(self.conninfo(dbname), autocommit=autocommit, connect_timeout=10, **kw)

    def sql(self, query: str, params=None, dbname: str = "postgres", timeout_s: float = 120):
        with self.connect(dbname) as c:
            c.execute(f"SET statement_timeout = {int(timeout_s * 1000)}")
            cur = c.execute(query, params)
            return cur.fetchall() if cur.description else None

    def scalar(self, query: str, params=None, **kw):
        rows = self.sql(query, params, **kw)
        return rows[0][0] if rows else None

    def alter_system(self, settings: dict) -> None:
        """ALTER SYSTEM SET each setting, then reload (SHOW follows asynchronously)."""
        with self.connect() as c:
            for k, v in settings.items():
                c.execute(f"ALTER SYSTEM SET {k} = {q(v)}")
            c.execute("SELECT pg_reload_conf()")


class Node(SqlNode):
    def __init__(self, cluster: "Cluster", index: int, name: str, upstream: "Node | None",
                 disk_profile: str, net_profile: str = "none", sync: bool = False):
        self.cluster = cluster
        self.index = index
        self.name = name
        self.upstream = upstream
        self.sync = sync
        self.disk_profile = diskmod.profile(disk_profile)
        self.net_profile = netem.profile(net_profile)
        self.root = cluster.root / name
        self.disk = diskmod.Disk(f"{cluster.id}-{name}", self.root / "mnt", cluster.spec.disk_mb)
        self.datadir = self.root / "mnt" / "data"
        self.sockdir = self.root / "mnt" / "sock"
        self.logfile = self.root / "mnt" / "server.log"
        from .util import free_port

        self.port = free_port()
        self.netns = f"{PREFIX}-{cluster.id}-{name}" if cluster.use_ns else None
        self.proxy: netem.Proxy | None = None
        self.running = False
        # more environment for the server (the audit's volatile page cache)
        self.extra_env: dict = {}
        # settings of this node that survive pg_rewind and a new base backup
        # (written into lab_node.conf at every start)
        self.conf_extra: dict = {}

    # addresses
    def addr_for(self, downstream: "Node") -> str:
        """Address at which `downstream` reaches this node."""
        if self.cluster.use_ns:
            return f"{SUBNET}.{downstream.index}.1"
        return "127.0.0.1"

    def bin(self, tool: str) -> str:
        return str(self.cluster.spec.bin_dir / tool)

    def env(self) -> dict:
        e = dict(self.disk_profile.env())
        if self.extra_env:
            e.update(self.extra_env)
        return e

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host={self.sockdir} port={self.port} user=postgres dbname={dbname}"

    def pgbench_target(self) -> list[str]:
        return ["-h", str(self.sockdir), "-p", str(self.port), "-U", "postgres", "postgres"]

    # lifecycle
    def node_conf(self) -> str:
        lines = [
            "# written by pgwal-lab for this node",
            f"port = {self.port}",
            f"listen_addresses = {q('*' if self.cluster.use_ns else '127.0.0.1')}",
            f"unix_socket_directories = {q(self.sockdir)}",
            f"cluster_name = {q(self.name)}",
        ]
        if self.is_primary:
            sync = [n.name for n in self.cluster.standbys if n.sync and n.upstream is self]
            sync.sort(key=lambda name: name != getattr(self.cluster, "sync_first", None))
            if sync:
                k = min(self.cluster.spec.num_sync, len(sync))
                lines.append(f"synchronous_standby_names = "
                             f"{q(f'{self.cluster.spec.sync_method} {k} (' + ', '.join(sync) + ')')}")
            else:
                lines.append("synchronous_standby_names = ''")
        else:
            up = self.upstream
            if self.proxy:
                host, port = "127.0.0.1", self.proxy.port
            else:
                host, port = up.addr_for(self), up.port
            lines.append(f"primary_conninfo = {q(f'host={host} port={port} user=postgres application_name={self.name}')}")
        lines += [f"{k} = {q(v)}" for k, v in self.conf_extra.items()]
        return "\n".join(lines) + "\n"

    def write_node_conf(self) -> None:
        p = self.datadir / "lab_node.conf"
        p.write_text(self.node_conf())
        chown_to_pg(p)

    def run_pg(self, cmd, timeout: float = 120, check: bool = True, env: dict | None = None):
        e = dict(self.env())
        if env:
            e.update(env)
        return run(cmd, timeout=timeout, check=check, netns=self.netns, as_pg=True, env=e or None)

    def initdb(self) -> None:
        self.run_pg([self.bin("initdb"), "-D", self.datadir, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                     "--locale=C", "-N"], timeout=180)
        conf = self.datadir / "postgresql.conf"
        with conf.open("a") as f:
            f.write("\n# pgwal-lab\n")
            # every other setting keeps the server's default (a standby's
            # wal_receiver_reply_events too), as a user's server would
            settings = {**BASE_SETTINGS, **self.cluster.spec.settings}
            for k, v in settings.items():
                f.write(f"{k} = {q(v)}\n")
            f.write("include_if_exists = 'lab_node.conf'\n")
        (self.datadir / "pg_hba.conf").write_text(
            "local all all trust\nlocal replication all trust\n"
            "host all all 0.0.0.0/0 trust\nhost replication all 0.0.0.0/0 trust\n"
            "host all all ::1/128 trust\nhost replication all ::1/128 trust\n")
        chown_to_pg(self.datadir / "pg_hba.conf")
        self.write_node_conf()

    def basebackup(self) -> None:
        up = self.upstream
        self.run_pg([self.bin("pg_basebackup"), "-D", self.datadir, "-h", up.addr_for(self), "-p", up.port,
                     "-U", "postgres", "-X", "stream", "-c", "fast", "-N"], timeout=600)
        (self.datadir / "standby.signal").touch()
        chown_to_pg(self.datadir / "standby.signal")
        # the copied auto.conf carries the primary's ALTER SYSTEM settings: drop them
        (self.datadir / "postgresql.auto.conf").write_text("")
        chown_to_pg(self.datadir / "postgresql.auto.conf")
        self.write_node_conf()

    def start(self, timeout: float = 120, wait: bool = True) -> None:
        """Start the server; wait=False returns once pg_ctl launched it."""
        self.sockdir.mkdir(parents=True, exist_ok=True)
        chown_to_pg(self.sockdir)
        if self.upstream is not None and self.net_profile.proxy and self.proxy is None:
            up = self.upstream
            self.proxy = netem.Proxy(self.net_profile, f"{up.addr_for(self)}:{up.port}", netns=self.netns,
                                     tag=f"{self.cluster.id}-{self.name}").start()
            self.cluster.save_state()
        self.write_node_conf()
        try:
            self.run_pg([self.bin("pg_ctl"), "-D", self.datadir, "-l", self.logfile, "-w" if wait else "-W",
                         "-t", int(timeout), "start"], timeout=timeout + 10)
        except LabError as e:
            raise LabError(f"{self.name} did not start: {e}\nserver log:\n{self.log_tail()}") from None
        self.running = True

    def stop(self, mode: str = "fast", timeout: float = 60) -> None:
        if (self.datadir / "postmaster.pid").exists():
            p = self.run_pg([self.bin("pg_ctl"), "-D", self.datadir, "-m", mode, "-w", "-t", int(timeout), "stop"],
                            timeout=timeout + 10, check=False)
            if p.returncode != 0 and mode != "immediate":
                self.run_pg([self.bin("pg_ctl"), "-D", self.datadir, "-m", "immediate", "-w", "stop"],
                            timeout=30, check=False)
        self.running = False

    def stop_proxy(self) -> None:
        if self.proxy:
            self.proxy.stop()
            self.proxy = None

    def set_net(self, net_profile: str | netem.NetProfile) -> None:
        """Change the link's delay: restart the proxy; the walreceiver reconnects."""
        self.net_profile = netem.profile(net_profile)
        self.stop_proxy()
        if self.running:
            self.stop()
            self.start()

    def set_disk(self, disk_profile: str | diskmod.DiskProfile) -> None:
        """Change the disk latency profile (restarts the node: the shim reads its env at start)."""
        self.disk_profile = diskmod.profile(disk_profile)
        if self.running:
            self.stop()
            self.start()

    def restart(self) -> None:
        self.stop()
        self.start()

    def pid(self) -> int | None:
        try:
            return int((self.datadir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class ReplicationSet:
    """What the method needs of any primary + standbys: replication waits
    and positions over SQL.  `local_processes`: the servers run on this
    machine, so their processes' CPU and I/O can be read from /proc."""

    primary: SqlNode
    nodes: dict
    local_processes = True

    @property
    def standbys(self) -> list:
        return [n for n in self.nodes.values() if not n.is_primary]

    def wait_streaming(self, timeout: float = 60) -> None:
        for n in self.standbys:
            if not n.running:
                continue
            wait_for(lambda: n.upstream.scalar(
                "SELECT count(*) FROM pg_stat_replication WHERE application_name = %s AND state = 'streaming'",
                (n.name,)), timeout, f"{n.name} streaming")

    def current_lsn(self) -> str:
        return self.primary.scalar("SELECT pg_current_wal_lsn()::text")

    def wait_replay(self, timeout: float = 120, lsn: str | None = None) -> float:
        """Wait until every running standby has replayed the primary's current LSN."""
        t0 = time.monotonic()
        target = lsn or self.current_lsn()
        for n in self.standbys:
            if not n.running:
                continue
            wait_for(lambda: n.scalar("SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), %s::pg_lsn) >= 0",
                                      (target,)), timeout, f"{n.name} to replay {target}")
        return time.monotonic() - t0

    def server_version(self) -> str:
        return self.primary.scalar("SHOW server_version")


class Cluster(ReplicationSet):
    """A running primary + standbys.  Use as a context manager: it is torn
    down on success, failure and KeyboardInterrupt."""

    def __init__(self, spec: ClusterSpec, cluster_id: str | None = None):
        self.spec = spec
        self.spec.bin_dir = Path(spec.bin_dir)
        self.id = cluster_id or secrets.token_hex(2)
        self.use_ns = is_root() if spec.namespaces is None else spec.namespaces
        if self.use_ns and not is_root():
            raise LabError("network namespaces need root")
        self.root = workdir() / f"c-{self.id}"
        self.statefile = state_dir() / f"cluster-{self.id}.json"
        self.namespaces: list[str] = []
        self.sync_first: str | None = None  # the synchronous candidate listed first, if not definition order
        self.nodes: dict[str, Node] = {}
        self.primary = Node(self, 0, spec.primary_name, None, spec.primary_disk)
        self.nodes[spec.primary_name] = self.primary
        for i, s in enumerate(spec.standbys, start=1):
            if s.upstream not in self.nodes:
                raise LabError(f"standby {s.name}: upstream {s.upstream} must be defined before it")
            self.nodes[s.name] = Node(self, i, s.name, self.nodes[s.upstream], s.disk, s.net, s.sync)

    def save_state(self) -> None:
        st = {
            "id": self.id, "root": str(self.root), "bin_dir": str(self.spec.bin_dir), "pid": os.getpid(),
            "namespaces": self.namespaces,
            "nodes": [{"name": n.name, "datadir": str(n.datadir), "mount": str(n.disk.mountpoint) if n.disk.mounted else None,
                       "loop": n.disk.loopdev, "image": str(n.disk.image) if n.disk.image else None,
                       "netns": n.netns, "proxy_pidfile": str(n.proxy.pidfile) if n.proxy else None}
                      for n in self.nodes.values()],
        }
        self.statefile.write_text(json.dumps(st, indent=1))

    def _setup_network(self) -> None:
        for n in self.nodes.values():
            run(["ip", "netns", "add", n.netns])
            self.namespaces.append(n.netns)
            self.save_state()
            run(["ip", "-n", n.netns, "link", "set", "lo", "up"])
        for n in self.standbys:
            a, b = f"pw{self.id}-{n.index}u", f"pw{self.id}-{n.index}d"
            run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
            run(["ip", "link", "set", a, "netns", n.upstream.netns])
            run(["ip", "link", "set", b, "netns", n.netns])
            run(["ip", "-n", n.upstream.netns, "addr", "add", f"{SUBNET}.{n.index}.1/24", "dev", a])
            run(["ip", "-n", n.netns, "addr", "add", f"{SUBNET}.{n.index}.2/24", "dev", b])
            run(["ip", "-n", n.upstream.netns, "link", "set", a, "up"])
            run(["ip", "-n", n.netns, "link", "set", b, "up"])

    def create(self) -> "Cluster":
        if not (self.spec.bin_dir / "postgres").exists():
            raise LabError(f"no postgres in {self.spec.bin_dir}")
        self.root.mkdir(parents=True, exist_ok=True)
        if is_root():
            self.root.chmod(0o755)
        self.save_state()
        try:
            if self.use_ns:
                self._setup_network()
            for n in self.nodes.values():
                n.root.mkdir(parents=True, exist_ok=True)
                n.disk.create()
                self.save_state()
            self.primary.initdb()
            self.primary.start()
            for n in self.standbys:  # definition order: upstreams come first
                n.basebackup()
                n.start()
            self.wait_streaming()
        except BaseException:
            self.destroy()
            raise
        return self

    def prove(self) -> dict:
        """Show that the build, disks and links are what the nodes are labelled with."""
        from . import proof

        return proof.prove(self)

    def restart_all(self) -> None:
        """Stop every node (the primary first, so its walsenders send what
        it has), then start them again: the next run begins with fresh
        processes and shared memory, whatever the run before it set up."""
        running = [n for n in self.nodes.values() if n.running]
        for n in running:
            n.stop()
        for n in running:
            n.start()
        self.wait_streaming()

    def switch_build(self, bin_dir: Path) -> None:
        """Run every node on the binaries in bin_dir from now on.

        The builds must share the data directory format (pgwal's series
        changes no catalog; compat/stock_roundtrip.pl checks it).  Settings
        made with ALTER SYSTEM are reset first: the other build may not know
        them and would refuse to start; the method sets each variant's own
        again before its run."""
        bin_dir = Path(bin_dir)
        if not (bin_dir / "postgres").exists():
            raise LabError(f"no postgres in {bin_dir}")
        for n in self.nodes.values():
            if n.running:
                n.sql("ALTER SYSTEM RESET ALL")
        running = [n for n in self.nodes.values() if n.running]
        for n in running:
            n.stop()
        self.spec.bin_dir = bin_dir
        self.save_state()
        for n in running:
            n.start()
        self.wait_streaming()

    def set_setting(self, name: str, value, node: Node | None = None) -> None:
        (node or self.primary).alter_system({name: value})

    def destroy(self) -> None:
        errors = []
        for n in reversed(list(self.nodes.values())):
            try:
                n.stop(mode="immediate" if not n.running else "fast")
            except Exception as e:  # keep tearing down
                errors.append(e)
            n.stop_proxy()
        for n in self.nodes.values():
            try:
                n.disk.destroy()
            except Exception as e:
                errors.append(e)
        for ns in self.namespaces:
            run(["ip", "netns", "del", ns], check=False)
        self.namespaces = []
        shutil.rmtree(self.root, ignore_errors=True)
        self.statefile.unlink(missing_ok=True)
        if errors:
            raise LabError(f"teardown errors: {errors}")

    def __enter__(self) -> "Cluster":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()


def simple_spec(bin_dir, standbys: int = 1, sync: bool = True, standby_disk: str = "tmpfs",
                primary_disk: str = "tmpfs", net: str = "none", settings: dict | None = None) -> ClusterSpec:
    return ClusterSpec(bin_dir=Path(bin_dir), primary_disk=primary_disk, settings=settings or {},
                       standbys=[StandbySpec(f"s{i}", sync=sync, disk=standby_disk, net=net)
                                 for i in range(1, standbys + 1)])
