"""The wire: typed errors, framing over ZeroMQ, the request/reply protocol and the client library.

The bottom layer. It imports no torch and nothing else of Packrat, so workers, the daemon and
users' programs all build on it. The protocol: ``codec`` (what both sides share), the server's side in
``server_side`` (parse requests), ``model_checks`` (check them against the model) and ``server_replies`` (encode
replies), and ``client_side`` (encode requests, decode replies);
``client`` is the client library on top of ``client_side``.
"""
