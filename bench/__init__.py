"""Benchmarks: commands that print their figures (and write JSON); none is a timed test."""
