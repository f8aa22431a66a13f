"""Pure planning types: latency profiles, the machine's topology and core allocation, batch distributions,
and the layout each batch runs on (layouts).

Policies plan over these; the daemon, the workers and the CLI read them. Nothing here imports the
daemon, the workers or torch.
"""
