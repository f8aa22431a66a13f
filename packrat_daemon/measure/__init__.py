"""Measuring on real workers: full profiles, side-by-side plan confirmations and split checks."""
