"""The history explorer: faults in sequence on one long-lived cluster, judged
after every step (`pgwal-lab run histories`).

  schedule.py  steps (a fault or an operation, with its level and timing),
               their text form, and the random choice of the next step
  cluster.py   the cluster a history lives on: four nodes, a cascade, a
               shared archive; roles that move (promotion, repointing,
               pg_rewind, a new base backup)
  steps.py     carrying out one step under the audit's ledger workload
  verdict.py   what must hold after each step: no promised commit lost,
               every node back and caught up in time (liveness), all nodes
               converged on one timeline, no archive conflict
  shrink.py    cutting a failing schedule down to a minimal one that still fails
  report.py    the report section: steps per kind and level, controls, failures
The scenario (histories, seeds, shrinking, records) is scenarios/histories.py.
"""
