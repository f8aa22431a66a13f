"""The wire: typed errors, framing over ZeroMQ, the request/reply protocol and the client library.

The bottom layer. It imports no torch and nothing else of Packrat, so workers, the daemon and
users' programs all build on it. The protocol is three modules: ``codec`` (what both sides share),
``server_side`` (parse requests, encode replies) and ``client_side`` (encode requests, decode replies);
``client`` is the client library on top of ``client_side``.
"""
