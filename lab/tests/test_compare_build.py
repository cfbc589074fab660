"""--set compare_bin: which second build a scenario accepts, and how its
variants are named (fake bin dirs: only their PGWAL-BUILD files matter)."""
from pathlib import Path

import pytest

from pgwal_lab.scenarios import compare_build, series_label
from pgwal_lab.util import LabError


def fake_build(root: Path, name: str, patches: list[str] | None) -> Path:
    """A bin dir with a postgres file and, for a patched build, PGWAL-BUILD."""
    bin_dir = root / name / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "postgres").write_text("")
    if patches is not None:
        (root / name / "PGWAL-BUILD").write_text(
            f"flavour={name}\npatches={' '.join(patches)} \ntree_head=0\n")
    return bin_dir


SERIES = [f"{n:04d}-Patch-{n}.patch" for n in range(1, 47)]


def test_label_is_the_last_patch(tmp_path):
    assert series_label(fake_build(tmp_path, "bench", SERIES)) == "0046"
    assert series_label(fake_build(tmp_path, "bench-upto-0044", SERIES[:44])) == "0044"


def test_accepts_a_patched_build_of_another_series(tmp_path):
    under_test = fake_build(tmp_path, "bench", SERIES)
    earlier = fake_build(tmp_path, "bench-upto-0044", SERIES[:44])
    assert compare_build({"compare_bin": str(earlier)}, under_test, None) == earlier.resolve()
    assert compare_build({}, under_test, None) is None


@pytest.mark.parametrize("case, message", [
    ("same", "same series"),
    ("stock", "not a patched build"),
    ("missing", "no postgres"),
])
def test_refuses(tmp_path, case, message):
    under_test = fake_build(tmp_path, "bench", SERIES)
    other = {"same": lambda: fake_build(tmp_path, "bench-copy", SERIES),
             "stock": lambda: fake_build(tmp_path, "stock-bench", None),
             "missing": lambda: tmp_path / "nowhere" / "bin"}[case]()
    with pytest.raises(LabError, match=message):
        compare_build({"compare_bin": str(other)}, under_test, None)


def test_refuses_an_existing_cluster(tmp_path):
    under_test = fake_build(tmp_path, "bench", SERIES)
    earlier = fake_build(tmp_path, "bench-upto-0044", SERIES[:44])
    with pytest.raises(LabError, match="lab-made cluster"):
        compare_build({"compare_bin": str(earlier)}, under_test, existing=object())
