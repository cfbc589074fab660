"""Remove leftovers of crashed runs: servers, proxies, mounts, loop devices,
namespaces (and with them their veths), state and data directories.
Only things the lab made are touched: they carry the `pgwal` prefix or live
under the lab's work directory."""
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


def lab_processes() -> list[tuple[int, str]]:
    """Postmasters with a data dir under the work dir and lab proxies."""
    wd = str(workdir())
    found = []
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        cmd = _cmdline(int(d.name))
        if not cmd or not cmd[0]:
            continue
        exe = os.path.basename(cmd[0])
        joined = " ".join(cmd)
        if exe in ("postgres", "postmaster") and "-D" in cmd and wd in joined:
            found.append((int(d.name), "postgres"))
        elif exe == "pgwal-netdelay" and len(cmd) > 1 and cmd[1] == "proxy":
            found.append((int(d.name), "proxy"))
    return found


def clean(log=print, proxies_all: bool = True) -> list[str]:
    done = []
    # 1. servers and proxies
    for pid, kind in lab_processes():
        if kind == "proxy" and not proxies_all:
            continue
        try:
            os.kill(pid, signal.SIGQUIT if kind == "postgres" else signal.SIGTERM)
            done.append(f"stopped {kind} {pid}")
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and lab_processes():
        time.sleep(0.1)
    for pid, kind in lab_processes():
        try:
            os.kill(pid, signal.SIGKILL)
            done.append(f"killed {kind} {pid}")
        except ProcessLookupError:
            pass
    # 2. mounts under the work dir
    wd = str(workdir())
    for line in Path("/proc/mounts").read_text().splitlines():
        mnt = line.split()[1]
        if mnt.startswith(wd + "/"):
            run(["umount", "-l", mnt], check=False)
            done.append(f"unmounted {mnt}")
    # 3. loop devices on lab images, and the images
    if is_root():
        for dev, backing in disk.leftover_loops():
            run(["losetup", "-d", dev], check=False)
            done.append(f"detached {dev} ({backing})")
    for img in Path("/dev/shm").glob(f"{PREFIX}-lab-*.img"):
        img.unlink(missing_ok=True)
        done.append(f"removed {img}")
    # 4. namespaces (veths go with them)
    if is_root():
        out = run(["ip", "netns", "list"], check=False).stdout or ""
        for line in out.splitlines():
            ns = line.split()[0] if line.split() else ""
            if ns.startswith(f"{PREFIX}-"):
                run(["ip", "netns", "del", ns], check=False)
                done.append(f"deleted netns {ns}")
        out = run(["ip", "-o", "link", "show"], check=False).stdout or ""
        for line in out.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith("pw") and "-" in name:
                run(["ip", "link", "del", name], check=False)
                done.append(f"deleted link {name}")
    # 5. state files and cluster directories
    for f in state_dir().glob("*"):
        if f.suffix == ".json":
            try:
                root = json.loads(f.read_text()).get("root")
                if root and root.startswith(wd):
                    shutil.rmtree(root, ignore_errors=True)
            except (OSError, ValueError):
                pass
        f.unlink(missing_ok=True)
    for d in workdir().glob("c-*"):
        shutil.rmtree(d, ignore_errors=True)
        done.append(f"removed {d}")
    for line in done:
        log(line)
    return done
