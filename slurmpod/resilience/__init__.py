"""Checkpoint interval, goodput simulation and failure history (docs/resilience.md)."""
