"""`packrat coordinate`: one coordinator over several daemons on one machine, each daemon serving one model.

The coordinator owns the machine's cores. It divides them into one disjoint share per model (`shares`), asks
each daemon for its live demand through its control socket, plans the models jointly
(`policies.colocation`), and moves cores between them only when the move is predicted to pay, shrinking the
model that loses cores before the one that gains them is told to grow (`loop`). docs/colocation.md.
"""
