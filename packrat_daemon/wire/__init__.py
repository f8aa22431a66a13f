"""The wire: errors, framing over ZeroMQ, the request/reply protocol and the client library.

The bottom layer. It imports no torch and nothing else of Packrat, so workers, the daemon and
users' programs all build on it.
"""
