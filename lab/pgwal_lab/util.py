"""Shared helpers: paths, running commands (bounded in time), privilege drop."""
from __future__ import annotations

import itertools
import os
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

LAB_DIR = Path(__file__).resolve().parent.parent
REPO = LAB_DIR.parent
# Run from a pgwal checkout (lab/pgwal-lab, lab/test.sh) or installed with
# `pip install ./lab`; installed, nothing is taken from a checkout: servers
# run via runuser, the shim is built in the work dir, results go to the
# current directory, bin dirs and the proxy come from options or PATH.
IN_CHECKOUT = (LAB_DIR / "pgwal-lab").exists() and (REPO / "tools" / "as-user").exists()
AS_USER = REPO / "tools" / "as-user"
BUILD_DIR = LAB_DIR / ".build"
PREFIX = "pgwal"  # every namespace, veth, loop file and mount carries it


class LabError(RuntimeError):
    pass


def is_root() -> bool:
    return os.geteuid() == 0


def workdir() -> Path:
    """Runtime directory for clusters (data dirs, sockets, state files)."""
    default = "/tmp/pgwal-lab" if is_root() else f"/tmp/pgwal-lab-{os.geteuid()}"
    d = Path(os.environ.get("PGWAL_LAB_WORKDIR", default))
    d.mkdir(parents=True, exist_ok=True)
    if is_root():
        d.chmod(0o755)
    return d


def state_dir() -> Path:
    d = workdir() / "state"
    d.mkdir(exist_ok=True)
    return d


def results_dir(name: str) -> Path:
    """Where a run's results go by default: lab/results/ in a checkout, else
    ./pgwal-lab-results/."""
    base = LAB_DIR / "results" if IN_CHECKOUT else Path.cwd() / "pgwal-lab-results"
    return base / name


def default_pg_bin() -> Path:
    env = os.environ.get("PGWAL_LAB_PG_BIN")
    if env:
        return Path(env).resolve()
    cands = [REPO / ".build/install/check/bin"] if IN_CHECKOUT else []
    for cand in cands + [Path("/usr/lib/postgresql/15/bin")]:
        if (cand / "postgres").exists():
            return cand
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if found:
        return found[-1].parent
    raise LabError("no PostgreSQL bin dir: set PGWAL_LAB_PG_BIN")


_pg_user: str | None = None


def pg_user() -> str:
    """The unprivileged OS user servers run as: tools/as-user's in a checkout
    (which also lets it reach the checkout), else $PGWAL_USER (default
    pgwal), created when missing."""
    global _pg_user
    if not is_root():
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    if _pg_user is None:
        if IN_CHECKOUT:
            _pg_user = subprocess.run([str(AS_USER), "--ensure"], check=True, capture_output=True,
                                      text=True).stdout.strip()
        else:
            user = os.environ.get("PGWAL_USER", "pgwal")
            if subprocess.run(["id", "-u", user], capture_output=True).returncode != 0:
                subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--user-group", user],
                               check=True, capture_output=True)
            _pg_user = user
    return _pg_user


def as_pg_prefix() -> list[str]:
    """The command prefix that drops from root to pg_user()."""
    if IN_CHECKOUT:
        return [str(AS_USER)]
    return ["runuser", "-u", pg_user(), "--"]


def chown_to_pg(path: Path) -> None:
    if is_root():
        shutil.chown(path, pg_user(), pg_user())


def run(cmd, *, timeout: float = 120, check: bool = True, env=None, cwd=None, netns: str | None = None,
        as_pg: bool = False, capture: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    """Run a command, bounded in time.  netns: run inside that namespace;
    as_pg: drop to the unprivileged PostgreSQL user when root."""
    cmd = [str(c) for c in cmd]
    if as_pg and is_root():
        cmd = as_pg_prefix() + cmd
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update({k: str(v) for k, v in env.items()})
    try:
        p = subprocess.run(cmd, timeout=timeout, env=full_env, cwd=cwd, text=True, input=input,
                           stdout=subprocess.PIPE if capture else None,
                           stderr=subprocess.PIPE if capture else None)
    except subprocess.TimeoutExpired as e:
        raise LabError(f"timed out after {timeout}s: {shlex.join(cmd)}") from e
    if check and p.returncode != 0:
        raise LabError(f"command failed ({p.returncode}): {shlex.join(cmd)}\n{(p.stderr or '')[-2000:]}")
    return p


def popen(cmd, *, env=None, netns: str | None = None, as_pg: bool = False) -> subprocess.Popen:
    """Start a command as run() would, in a session (and process group) of
    its own, its output merged and piped; the caller waits for it."""
    cmd = [str(c) for c in cmd]
    if as_pg and is_root():
        cmd = as_pg_prefix() + cmd
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
    return subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


_FIRST_PORT = 10_000
_port_cursor = itertools.count()


def ephemeral_port_floor() -> int:
    """The lowest port the kernel hands out as a client's source port."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def room_below_ephemeral_range() -> bool:
    """Whether free_port() can stay below the ephemeral range (where the range
    starts near 1024 it falls back to the kernel's choice)."""
    return ephemeral_port_floor() > _FIRST_PORT + 1000


def free_port() -> int:
    """A port for a server or proxy to listen on, chosen below the ephemeral
    range: a client socket could otherwise take it as its source port before
    the listener binds it ("could not bind ... Address already in use")."""
    if room_below_ephemeral_range():
        span = ephemeral_port_floor() - _FIRST_PORT
        seed = os.getpid() * 7919  # processes walk different stretches
        for _ in range(span):
            port = _FIRST_PORT + (seed + next(_port_cursor)) % span
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process, in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def proc_schedstat(pid: int) -> tuple[int, int] | None:
    """(ns waited on a run queue, times run) of a process, from
    /proc/<pid>/schedstat: how long it waited for a core once runnable."""
    try:
        _, wait_ns, runs = Path(f"/proc/{pid}/schedstat").read_text().split()[:3]
        return int(wait_ns), int(runs)
    except (OSError, ValueError):
        return None


def run_queue_wait_us(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Mean µs a process waited for a core each time it ran, between two
    proc_schedstat() readings of it."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) / 1000


class CpuTimes(NamedTuple):
    """Jiffies of all CPUs together, from the first line of /proc/stat."""
    busy: float  # total - idle - iowait
    total: float
    steal: float  # time the hypervisor ran something else while this VM wanted the CPU


def parse_cpu_times(stat_text: str) -> CpuTimes:
    """Parse the aggregate `cpu` line of /proc/stat (raises ValueError if absent)."""
    line = stat_text.splitlines()[0] if stat_text else ""
    if not line.startswith("cpu "):
        raise ValueError("no aggregate cpu line")
    f = [int(x) for x in line.split()[1:]]
    f += [0] * (8 - len(f))
    total = sum(f[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
    return CpuTimes(float(total - f[3] - f[4]), float(total), float(f[7]))


def host_cpu_times() -> CpuTimes | None:
    """The machine's CPU times now, or None where /proc/stat cannot be read."""
    try:
        return parse_cpu_times(Path("/proc/stat").read_text())
    except (OSError, ValueError):
        return None


def cpu_share_pct(before: CpuTimes | None, after: CpuTimes | None, field: str) -> float | None:
    """`field` ("busy" or "steal") as % of all CPU time between two readings."""
    if not before or not after or after.total <= before.total:
        return None
    return (getattr(after, field) - getattr(before, field)) / (after.total - before.total) * 100


def crate_binary(name: str, env_var: str, also: tuple = ()) -> Path | None:
    """A binary of the crates/ workspace: $env_var, the checkout's release
    build (then `also`, then its debug build), or PATH; None if none exists."""
    env = os.environ.get(env_var)
    cands = [Path(env)] if env else []
    if IN_CHECKOUT:
        cands += [REPO / f"crates/target/release/{name}", *also, REPO / f"crates/target/debug/{name}"]
    on_path = shutil.which(name)
    if on_path:
        cands.append(Path(on_path))
    return next((c for c in cands if c.exists()), None)


def netdelay_binary() -> Path:
    found = crate_binary("pgwal-netdelay", "PGWAL_NETDELAY", (BUILD_DIR / "netdelay/target/release/pgwal-netdelay",))
    if found is None:
        raise LabError("pgwal-netdelay not found: in a checkout, cd crates && cargo build --release -p "
                       "pgwal-netdelay; otherwise cargo install --path crates/pgwal-netdelay, or set PGWAL_NETDELAY")
    return found


def pgwal_binary() -> Path:
    """The pgwal CLI (the consumer audits run it)."""
    found = crate_binary("pgwal", "PGWAL_BIN")
    if found is None:
        raise LabError("pgwal not found: cd crates && cargo build --release -p pgwal-cli, or set PGWAL_BIN")
    return found
