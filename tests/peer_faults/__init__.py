"""Peer-fault scenarios: two ranks, one faults mid-loop, what the survivor sees (scenarios.py)."""
