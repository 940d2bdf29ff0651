"""Checks of the engine that decoding itself never uses (scripts/gpu_check.py and the tests do):
an oracle drafter that hits a chosen acceptance schedule (`oracle.py`), and a host-sync counter
(`syncs.py`)."""
