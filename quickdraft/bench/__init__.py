"""Benchmarks: every method is run side by side with its baseline in one process."""
