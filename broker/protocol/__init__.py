"""Pulsar binary protocol: the protobuf schema, framing, checksums and command builders."""
