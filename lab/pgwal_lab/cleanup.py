"""Remove leftovers of crashed runs: servers, proxies, mounts, loop devices,
namespaces (and with them their veths), state and data directories.
Only things the lab made are touched: they carry the `pgwal` prefix or live
under the lab's work directory.  Clusters whose owning process is still
alive (another lab run on this machine) are left alone unless force=True."""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

from . import disk
from .util import PREFIX, is_root, run, state_dir, workdir


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def live_clusters(force: bool = False) -> dict[str, str]:
    """id -> root of clusters owned by another live process."""
    live = {}
    if force:
        return live
    for f in state_dir().glob("cluster-*.json"):
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        owner = int(st.get("pid") or 0)
        if owner and owner != os.getpid() and _alive(owner):
            live[st["id"]] = st["root"]
    return live


def _proxy_owner(pid: int) -> str | None:
    """Cluster id (or tag) of a lab proxy from its pid file."""
    for f in state_dir().glob("proxy-*.pid"):
        try:
            if int(f.read_text().strip()) == pid:
                return f.name[len("proxy-"):-len(".pid")].split("-")[0]
        except (OSError, ValueError):
            continue
    return None


def lab_processes(live: dict[str, str] | None = None) -> list[tuple[int, str]]:
    """Postmasters with a data dir under the work dir and lab proxies,
    except those of live clusters."""
    live = live or {}
    wd = str(workdir())
    found = []
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        pid = int(d.name)
        cmd = _cmdline(pid)
        if not cmd or not cmd[0]:
            continue
        exe = os.path.basename(cmd[0])
        joined = " ".join(cmd)
        if exe in ("postgres", "postmaster") and "-D" in cmd and wd in joined:
            if not any(root in joined for root in live.values()):
                found.append((pid, "postgres"))
        elif exe == "pgwal-netdelay" and len(cmd) > 1 and cmd[1] == "proxy":
            if _proxy_owner(pid) not in live:
                found.append((pid, "proxy"))
    return found


def clean(log=print, force: bool = False) -> list[str]:
    done = []
    live = live_clusters(force)
    for cid in live:
        done.append(f"left cluster {cid} alone: its owner is still running (use --force)")
    # 1. servers and proxies
    for pid, kind in lab_processes(live):
        try:
            os.kill(pid, signal.SIGQUIT if kind == "postgres" else signal.SIGTERM)
            done.append(f"stopped {kind} {pid}")
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and lab_processes(live):
        time.sleep(0.1)
    for pid, kind in lab_processes(live):
        try:
            os.kill(pid, signal.SIGKILL)
            done.append(f"killed {kind} {pid}")
        except ProcessLookupError:
            pass

    def is_live(name: str) -> bool:
        return any(cid in name for cid in live) or any(root in name for root in live.values())

    # 2. mounts under the work dir
    wd = str(workdir())
    for line in Path("/proc/mounts").read_text().splitlines():
        mnt = line.split()[1]
        if mnt.startswith(wd + "/") and not is_live(mnt):
            run(["umount", "-l", mnt], check=False)
            done.append(f"unmounted {mnt}")
    # 3. loop devices on lab images, and the images
    if is_root():
        for dev, backing in disk.leftover_loops():
            if not is_live(backing):
                run(["losetup", "-d", dev], check=False)
                done.append(f"detached {dev} ({backing})")
    for img in Path("/dev/shm").glob(f"{PREFIX}-lab-*.img"):
        if not is_live(img.name):
            img.unlink(missing_ok=True)
            done.append(f"removed {img}")
    # 4. namespaces (veths go with them) and stray veths
    if is_root():
        out = run(["ip", "netns", "list"], check=False).stdout or ""
        for line in out.splitlines():
            ns = line.split()[0] if line.split() else ""
            if ns.startswith(f"{PREFIX}-") and not is_live(ns):
                run(["ip", "netns", "del", ns], check=False)
                done.append(f"deleted netns {ns}")
        out = run(["ip", "-o", "link", "show"], check=False).stdout or ""
        for line in out.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith("pw") and "-" in name and not is_live(name):
                run(["ip", "link", "del", name], check=False)
                done.append(f"deleted link {name}")
    # 5. state files and cluster directories
    for f in state_dir().glob("*"):
        if is_live(f.name):
            continue
        if f.suffix == ".json":
            try:
                root = json.loads(f.read_text()).get("root")
                if root and root.startswith(wd):
                    shutil.rmtree(root, ignore_errors=True)
            except (OSError, ValueError):
                pass
        f.unlink(missing_ok=True)
    for d in workdir().glob("c-*"):
        if not is_live(str(d)):
            shutil.rmtree(d, ignore_errors=True)
            done.append(f"removed {d}")
    for line in done:
        log(line)
    return done
