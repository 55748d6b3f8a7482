"""Benchmark scripts and the HiGHS reference solver; never part of test pass/fail."""
