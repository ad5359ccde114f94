"""check_message_metadata: what a SEND's MessageMetadata must satisfy to be stored (unit tests, no broker)."""

from __future__ import annotations

import struct

import pytest

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol import validate
from magnetar.broker.protocol.validate import InvalidMetadataError, check_message_metadata


def _entry(meta: bytes, payload: bytes = b"x" * 10) -> bytes:
    return b"\x0e\x01\x00\x00\x00\x00" + struct.pack(">I", len(meta)) + meta + payload


def _meta(**fields: object) -> pb.MessageMetadata:
    m = pb.MessageMetadata(producer_name="PNAME", sequence_id=1, publish_time=1_700_000_000_000)
    for k, v in fields.items():
        if isinstance(v, list):
            getattr(m, k).extend(v)
        else:
            setattr(m, k, v)
    return m


def test_valid_metadata_passes() -> None:
    m = _meta(properties=[pb.KeyValue(key="k", value="välue")], partition_key="key", uuid="u")
    check_message_metadata(_entry(m.SerializeToString()))


@pytest.mark.parametrize(
    ("meta", "text", "field"),
    [
        (_meta(), b"PNAME", "producer_name"),
        (_meta(partition_key="PKEY"), b"PKEY", "partition_key"),
        (_meta(properties=[pb.KeyValue(key="PROPK", value="v")]), b"PROPK", "properties.key"),
        (_meta(replicate_to=["a", "CLUSTER"]), b"CLUSTER", "replicate_to"),
        (
            _meta(
                encryption_keys=[pb.EncryptionKeys(key="EK", value=b"v", metadata=[pb.KeyValue(key="MK", value="v")])]
            ),
            b"MK",
            "encryption_keys.metadata.key",
        ),
    ],
)
def test_invalid_utf8_anywhere_is_refused_and_named(meta: pb.MessageMetadata, text: bytes, field: str) -> None:
    raw = meta.SerializeToString()
    assert raw.count(text) == 1
    bad = raw.replace(text, b"\xff" * len(text))
    with pytest.raises(InvalidMetadataError, match=f"{field} is not valid UTF-8"):
        check_message_metadata(_entry(bad))


def test_bytes_fields_may_hold_any_bytes() -> None:
    m = _meta(ordering_key=b"\xff\xfe", schema_version=b"\x80")
    check_message_metadata(_entry(m.SerializeToString()))


def test_missing_required_field_is_refused() -> None:
    m = pb.MessageMetadata(producer_name="p", sequence_id=1)
    with pytest.raises(InvalidMetadataError, match="missing publish_time"):
        check_message_metadata(_entry(m.SerializePartialToString()))


def test_garbage_is_refused() -> None:
    with pytest.raises(InvalidMetadataError, match="Invalid message metadata"):
        check_message_metadata(_entry(b"\xff\xff\xff\xff"))


def test_batch_claiming_more_messages_than_its_bytes_hold_is_refused() -> None:
    m = _meta(num_messages_in_batch=1000)
    with pytest.raises(InvalidMetadataError, match="Invalid batch"):
        check_message_metadata(_entry(m.SerializeToString(), b"x" * 60))
    check_message_metadata(_entry(_meta(num_messages_in_batch=10).SerializeToString(), b"x" * 60))


def test_each_check_judges_only_its_own_metadata() -> None:
    """The parse message is reused between SENDs: nothing of an earlier entry may count for a later one."""
    complete = _entry(_meta(num_messages_in_batch=1000).SerializeToString(), b"x" * 6000)
    partial = _entry(pb.MessageMetadata(producer_name="p", sequence_id=1).SerializePartialToString())
    batch_lie = _entry(_meta(num_messages_in_batch=1000).SerializeToString(), b"x" * 60)
    for _ in range(validate.SCRATCH_PARSES + 2):  # across the reused message's replacement too
        check_message_metadata(complete)
        with pytest.raises(InvalidMetadataError, match="missing publish_time"):
            check_message_metadata(partial)
        check_message_metadata(complete)
        with pytest.raises(InvalidMetadataError, match="Invalid batch"):
            check_message_metadata(batch_lie)


def test_dispatch_decodes_each_entry_on_its_own() -> None:
    """entry_meta / entry_num_messages parse into a reused message too: no field of an earlier entry (key, batch
    count, delivery time, chunk) may show through in a later one."""
    from magnetar.broker.protocol.frames import NONE_KEY, entry_meta, entry_num_messages

    batch_meta = _meta(num_messages_in_batch=5, partition_key="k", deliver_at_time=99)
    batch = _entry(batch_meta.SerializeToString(), b"x" * 600)
    chunk = _entry(_meta(uuid="u-1", num_chunks_from_msg=3, chunk_id=1, ordering_key=b"o").SerializeToString(), b"y")
    plain = _entry(_meta().SerializeToString(), b"z")
    for _ in range(validate.SCRATCH_PARSES + 2):  # across the reused message's replacement too
        b, c, p = entry_meta(batch), entry_meta(chunk), entry_meta(plain)
        assert (b.num_messages, b.sticky_key, b.deliver_at, b.is_batch, b.chunk_uuid) == (5, b"k", 99, True, None)
        assert (c.num_messages, c.sticky_key, c.chunk_uuid, c.chunk_id, c.num_chunks) == (1, b"o", "u-1", 1, 3)
        assert (p.num_messages, p.sticky_key, p.deliver_at, p.is_batch, p.chunk_uuid) == (1, NONE_KEY, 0, False, None)
        assert (entry_num_messages(batch), entry_num_messages(plain), entry_num_messages(chunk)) == (5, 1, 1)
