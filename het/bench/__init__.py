"""Benchmarks behind `het bench`; each returns a dict printed as one JSON line."""
