"""One module per `packrat` command; each exposes `add_parser(subparsers)` and sets `run`."""
