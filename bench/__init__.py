"""Benchmarks: each prints its figures and writes JSON under bench/results/."""
