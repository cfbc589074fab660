"""pgwal lab: multi-node PostgreSQL clusters with emulated network and disks,
an interleaved benchmark method with statistics, and reports."""

__version__ = "0.1.0"
