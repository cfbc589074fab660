"""The durability audit: what each acknowledgement survives, counted in
crash loops (`pgwal-lab run audit`).

  ledger.py    writers that record a transaction only once COMMIT returned,
               readers that record what they saw
  faults.py    process crash, emulated power loss, failover, rejoin
  check.py     a node's tables against the ledger; what each level promises
  report.py    the table per level x fault x node
The scenario itself (cycles, levels, cluster) is scenarios/audit.py.
"""
