"""Messages returned raw by peek / examine / get-message-by-id (``X-Pulsar-*`` headers and payload)."""

from __future__ import annotations

import base64
import contextlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any

from magnetar.admin_client.client import Response
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.cli.admin.output import hexdump


@dataclass(slots=True)
class PeekedMessage:
    """One message from peek/examine/get-message-by-id (headers ``X-Pulsar-*`` + payload)."""

    message_id: str
    payload: bytes
    properties: dict[str, str]
    publish_time: str | None = None
    event_time: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "messageId": self.message_id,
            "publishTime": self.publish_time,
            "eventTime": self.event_time,
            "properties": self.properties,
            "payload": base64.b64encode(self.payload).decode(),
        }
        with contextlib.suppress(UnicodeDecodeError):
            data["payloadText"] = self.payload.decode("utf-8")
        data.update(self.extra)
        return data

    def to_text(self) -> str:
        label = "Batch Message ID" if self.message_id.count(":") >= 2 else "Message ID"
        lines = [f"{label}: {self.message_id}"]
        if self.publish_time is not None:
            lines.append(f"Publish time: {self.publish_time}")
        if self.event_time is not None:
            lines.append(f"Event time: {self.event_time}")
        for key, value in self.extra.items():
            lines.append(f"{key}: {value}")
        if self.properties:
            lines.append("Properties:")
            lines.append(json.dumps(self.properties, indent=2))
        lines.append(hexdump(self.payload))
        return "\n".join(lines)


def messages_from_response(resp: Response) -> list[PeekedMessage]:
    """Decode a raw-message response; a batch entry is split into its messages like pulsar-admin does."""
    message_id = resp.header("X-Pulsar-Message-ID") or "?"
    properties: dict[str, str] = {}
    extra: dict[str, str] = {}
    for name, value in resp.headers:
        lower = name.lower()
        if lower == "x-pulsar-property":
            # Newer brokers send all properties as one JSON header.
            try:
                properties.update({str(k): str(v) for k, v in json.loads(value).items()})
            except (ValueError, AttributeError):
                extra["Properties"] = value
        elif lower.startswith("x-pulsar-property-"):
            properties[name[len("x-pulsar-property-") :]] = value
        elif lower in ("x-pulsar-producer-name", "x-pulsar-sequence-id", "x-pulsar-partition-key"):
            extra[name[len("x-pulsar-") :].replace("-", " ").capitalize()] = value
    publish_time = resp.header("X-Pulsar-publish-time")
    event_time = resp.header("X-Pulsar-event-time")
    batch = resp.header("X-Pulsar-num-batch-message")
    if batch and batch.isdigit() and int(batch) > 0:
        singles = _split_batch(resp.body, int(batch))
        if singles is not None:
            base_id = ":".join(message_id.split(":")[:2])
            return [
                PeekedMessage(
                    f"{base_id}:{i}",
                    payload,
                    {**properties, **props},
                    publish_time,
                    str(evt) if evt else event_time,
                    dict(extra),
                )
                for i, (payload, props, evt) in enumerate(singles)
            ]
    return [PeekedMessage(message_id, resp.body, properties, publish_time, event_time, extra)]


def _split_batch(body: bytes, count: int) -> list[tuple[bytes, dict[str, str], int]] | None:
    """Split an uncompressed batch: ``count`` x (u32 metadata size, SingleMessageMetadata, payload)."""
    singles = []
    pos = 0
    try:
        for _ in range(count):
            (size,) = struct.unpack_from(">I", body, pos)
            pos += 4
            meta = pb.SingleMessageMetadata()
            meta.ParseFromString(body[pos : pos + size])
            pos += size
            payload = body[pos : pos + meta.payload_size]
            if len(payload) != meta.payload_size:
                return None
            pos += meta.payload_size
            singles.append((payload, {kv.key: kv.value for kv in meta.properties}, meta.event_time))
    except Exception:
        # Not a readable batch (compressed, or a broker that already split it): show the raw entry.
        return None
    return singles if pos == len(body) else None
