"""Reliability suite: faults, load, crashes, damaged input, cancellation, soak."""
