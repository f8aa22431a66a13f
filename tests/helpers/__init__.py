"""Helpers shared by the test packages: real daemons, generators of hostile input, replayed tables."""
