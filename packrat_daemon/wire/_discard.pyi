# The compiled loop of _discard.c (optional: its import fails where the install had no C compiler).
def discard(
    socket: int, most: int, msg_init: int, msg_recv: int, msg_more: int, msg_close: int, /
) -> tuple[int, int, bool]: ...
