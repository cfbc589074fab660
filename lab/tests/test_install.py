"""`pip install ./lab` gives a working `pgwal-lab` command that needs
nothing from the checkout (run here from another directory)."""
import json
import os
import shutil
import subprocess
import sys

from pgwal_lab.util import LAB_DIR, run


def test_pip_install_gives_a_working_command(tmp_path, pg_bin):
    # install from a copy, so the build leaves nothing in the checkout
    src = tmp_path / "src"
    shutil.copytree(LAB_DIR, src, ignore=shutil.ignore_patterns(".venv", ".build", "results", "build", "*.egg-info",
                                                                 "__pycache__", ".pytest_cache"))
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    # --no-compile: byte-compiling numpy, scipy and matplotlib was half of
    # the install's CPU (36 s against 20 s here); Python compiles what it
    # imports
    run([venv / "bin/pip", "install", "-q", "--no-compile", "-c", src / "requirements.txt", src], timeout=900)
    exe = venv / "bin/pgwal-lab"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PGWAL_LAB_PG_BIN")}

    def installed(*args, timeout=120):
        return subprocess.run([str(a) for a in args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=timeout, check=True)

    where = json.loads(installed(venv / "bin/python", "-c", "import json, pgwal_lab.util as u; "
                                 "print(json.dumps([u.IN_CHECKOUT, str(u.LAB_DIR)]))").stdout)
    assert where == [False, str(venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
                                / "site-packages")]
    assert "sync-modes" in installed(exe, "list").stdout
    # a smoke run from outside the checkout: shim built in the work dir,
    # environment proved, results under ./pgwal-lab-results
    p = installed(exe, "run", "hot-counter", "--smoke", "--bin", pg_bin, "--no-print", timeout=600)
    reports = list((tmp_path / "pgwal-lab-results").glob("hot-counter-*/report.md"))
    assert len(reports) == 1, p.stderr
    rec = json.loads((reports[0].parent / "runs.jsonl").read_text().splitlines()[0])
    assert rec["proof"]["nodes"]["primary"]["disk"]["shim"] is True
    assert rec["machine"]["repo_commit"] is None
