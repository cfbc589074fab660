"""The explorer's mutants (lab/mutants/, pgwal_lab/mutants.py): each says what
it breaks and which verdict should catch it, changes one promise in a few
lines, and still applies to the series' final tree.  Building them and
hunting them with histories takes hours: `pgwal-lab mutants` (not here)."""
from __future__ import annotations

import subprocess

import pytest

from pgwal_lab import mutants
from pgwal_lab.util import AS_USER, REPO

ALL = mutants.load()


def test_there_are_at_least_eight_and_each_says_what_it_breaks():
    assert len(ALL) >= 8
    for m in ALL:
        text = m.path.read_text()
        assert text.startswith(f"Mutant {m.name}: "), m.name
        assert m.breaks and m.catches, m.name
        assert m.files, f"{m.name} changes no file"
        # small: one promise, a few lines
        changed = [ln for ln in text.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
        assert 0 < len(changed) <= 12, f"{m.name} changes {len(changed)} lines"


def test_unknown_mutant_is_refused():
    with pytest.raises(mutants.LabError, match="no such mutant"):
        mutants.load(["no-such-mutant"])


@pytest.mark.skipif(not (REPO / ".build/pg/.git").is_dir(), reason="no build tree (server/pg build)")
@pytest.mark.parametrize("m", ALL, ids=[m.name for m in ALL])
def test_applies_to_the_series(m):
    r = subprocess.run([str(AS_USER), "git", "-c", "safe.directory=*", "-C", str(REPO / ".build/pg"),
                        "apply", "--check", str(m.path)], capture_output=True, text=True)
    assert r.returncode == 0, f"{m.name} no longer applies: {r.stderr}"


def _round(killed, histories, kind="safety"):
    return {"mutant": "m", "breaks": "b", "killed": killed, "histories": histories, "lab_defects": 0,
            "kind": kind if killed else None, "seed": 1, "step": 1}


def test_median_histories_to_kill_counts_a_surviving_round_as_more_than_any_kill():
    assert mutants.histories_to_kill([_round(True, 3), _round(True, 1), _round(True, 7)]) == 3
    assert mutants.histories_to_kill([_round(True, 2), _round(False, 10), _round(True, 9)]) == 9
    assert mutants.histories_to_kill([_round(True, 2), _round(True, 4)]) == 3
    # survives in at least half of its rounds: no median
    assert mutants.histories_to_kill([_round(True, 2), _round(False, 10)]) is None
    assert mutants.histories_to_kill([_round(False, 10), _round(False, 10), _round(True, 1)]) is None


def test_report_with_rounds_names_the_survivals():
    text = mutants.report([_round(True, 2), _round(False, 10), _round(True, 5, "liveness")])
    assert "0 of 1 mutants killed in every one of their 3 rounds" in text
    assert "| m | b | 2 of 3 | 2, survived 10, 5 | 5 | liveness, safety |" in text
