"""The shared codec: the id rule both sides apply, header JSON in and out, and message quoting."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from packrat_daemon.wire.codec import (
    MAX_ID_CHARS,
    check_request_id,
    dump_header,
    json_type,
    load_header,
    short_repr,
)


@pytest.mark.parametrize(
    "request_id", [0, -(2**63), 2**63 - 1, "", "r1", "x" * MAX_ID_CHARS, "é", "日本", "\U0001f600"]
)
def test_valid_ids(request_id: Any) -> None:
    assert check_request_id(request_id) is None
    dump_header({"id": request_id})  # every valid id can be echoed in a reply


@pytest.mark.parametrize(
    ("request_id", "fragment"),
    [
        (1.5, "the number 1.5"),
        (None, "null"),
        (True, "a boolean"),
        ([1], "an array"),
        ({"a": 1}, "an object"),
        ("x" * (MAX_ID_CHARS + 1), "129 characters"),
        (2**63, "64-bit"),
        (-(2**63) - 1, "64-bit"),
        ("\ud800", "lone surrogate"),
        ("ok\udfffok", "lone surrogate"),
    ],
)
def test_invalid_ids_say_why(request_id: Any, fragment: str) -> None:
    problem = check_request_id(request_id)
    assert problem is not None and fragment in problem


def test_a_surrogate_pair_escape_is_one_valid_character() -> None:
    # "\ud83d\ude00" in JSON is the pair for U+1F600: valid, unlike either half alone.
    header = load_header(b'{"id":"\\ud83d\\ude00"}')
    assert header["id"] == "\U0001f600" and check_request_id(header["id"]) is None
    assert check_request_id(load_header(b'{"id":"\\ud83d"}')["id"]) is not None


def test_dump_header_is_compact_utf8_and_takes_numpy_values() -> None:
    raw = dump_header({"id": "é", "n": np.int64(3), "a": np.arange(2), "t": (1, 2)})
    assert raw == '{"id":"é","n":3,"a":[0,1],"t":[1,2]}'.encode()


def test_dump_header_refuses_what_json_cannot_carry() -> None:
    with pytest.raises(ValueError, match="JSON"):
        dump_header({"x": float("inf")})
    with pytest.raises(TypeError, match="cannot put a object"):
        dump_header({"x": object()})


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"\xff{}", "UTF-8"),
        (b"{not json", "not valid JSON"),
        (b'{"a":NaN}', "NaN is not valid JSON"),
        (b'{"a":-Infinity}', "-Infinity is not valid JSON"),
        (b"[1]", "JSON object, got a JSON list"),
        (b"[" * 30000 + b"]" * 30000, "nested too deeply"),
        (b"{} {}", "Extra data"),
    ],
)
def test_load_header_says_why_a_frame_is_not_a_header(raw: bytes, fragment: str) -> None:
    with pytest.raises(ValueError) as caught:
        load_header(raw)
    assert fragment in str(caught.value)


def test_load_header_takes_whitespace_around_the_object_and_last_duplicate_key_wins() -> None:
    assert load_header(b' \n{"a": 1, "a": 2} ') == {"a": 2}
    assert load_header(memoryview(json.dumps({"b": [1]}).encode())) == {"b": [1]}


def test_error_messages_quote_huge_values_briefly() -> None:
    assert short_repr("abc") == "'abc'"
    assert len(short_repr(10**400)) == 40 and short_repr(10**400).endswith("...")
    assert json_type(10**400) == f"the number {short_repr(10**400)}"
