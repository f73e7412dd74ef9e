"""Tests of the tabular simulator (``sat_theory`` without its command line)."""
