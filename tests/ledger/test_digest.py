"""Digest framing of stored entries: the header alone (the add path's two parts) and the joined form."""

from __future__ import annotations

import pytest

from magnetar.ledger import digest
from magnetar.ledger.errors import DigestError


@pytest.mark.parametrize("size", [0, 1, 100, 128 * 1024])
def test_header_and_data_are_the_framed_entry(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    head = digest.frame_header(7, 3, 1000 + size, data)
    assert len(head) == digest.HEADER_SIZE
    stored = digest.frame(7, 3, 1000 + size, data)
    assert head + data == stored  # the parts write exactly the bytes of the one-piece form
    assert digest.unframe(7, 3, head + data) == (data, 1000 + size)


def test_the_header_checks_the_data_and_the_position() -> None:
    data = b"payload" * 100
    head = digest.frame_header(7, 3, 700, data)
    with pytest.raises(DigestError):
        digest.unframe(7, 3, head + data[:-1] + b"!")
    with pytest.raises(DigestError):
        digest.unframe(7, 4, head + data)
