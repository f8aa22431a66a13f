"""`packrat load`: traffic against a running daemon. `arrivals` is pure (also used by `packrat simulate`);
`generator` sends the traffic on the async client; `report` sums it up; `plot` draws a sweep."""
