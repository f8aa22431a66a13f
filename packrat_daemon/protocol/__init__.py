"""The Open Inference Protocol (KServe v2) frontend: REST and gRPC, for every Triton and KServe client.

`dataplane` is the transport-free core, `rest` and `grpc.server` its thin transports, `gateway` the process
that runs both beside the daemon and forwards each inference over the daemon's own protocol (`upstream`).
docs/oip.md describes it.
"""
