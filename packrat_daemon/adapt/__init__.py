"""Online adaptation: the live batch-size estimate, production timings and the tuner that re-plans."""
