"""A metadata file's new text read back in its key's type (``parse_text``): odd values are one
``TextError`` line (issue 43), never another exception -- an integer of more digits than
Python's ``int`` converts (4,300) included."""

from __future__ import annotations

import pytest

from tensorfs.formats.metadata_text import TextError, parse_text


@pytest.mark.parametrize("type_name, text", [
    ("uint32", b"9" * 5000),
    ("int64", b"-" + b"9" * 5000),
    ("uint64", b"1" + b"0" * 20),
    ("array[uint32]", b"1\n" + b"9" * 5000),
    ("array[array[int8]]", b"[" + b"9" * 5000 + b"]"),
])
def test_an_integer_beyond_every_range_is_one_line(type_name, text):
    with pytest.raises(TextError) as caught:
        parse_text(type_name, text)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


@pytest.mark.parametrize("type_name, text, value", [
    ("uint64", b"0" * 30 + b"18446744073709551615", 2**64 - 1),
    ("int64", b"-9223372036854775808", -2**63),
    ("int8", b"+0007", 7),
])
def test_integers_in_range_are_read_whatever_their_zeros(type_name, text, value):
    assert parse_text(type_name, text) == value
