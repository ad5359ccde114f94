"""Broker exceptions that map onto Pulsar's ``ServerError`` codes."""

from __future__ import annotations

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.ledger.api import LedgerError
from magnetar.managed_ledger.api import (
    CursorNotFoundError,
    ManagedLedgerClosedError,
    ManagedLedgerError,
    ManagedLedgerFencedError,
)
from magnetar.metadata.api import MetadataError as StoreMetadataError


class BrokerError(Exception):
    """A failure reported to the client with a Pulsar ``ServerError`` code.

    ``http_status`` is the status the admin API answers with when the error surfaces there
    (``None``: derived from the code).
    """

    code: pb.ServerError = pb.UnknownError
    http_status: int | None = None

    def __init__(self, message: str, code: pb.ServerError | None = None, http_status: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        if http_status is not None:
            self.http_status = http_status

    @property
    def message(self) -> str:
        return str(self)


class TopicNotFoundError(BrokerError):
    code = pb.TopicNotFound


class InvalidTopicNameError(BrokerError):
    code = pb.InvalidTopicName


class ConsumerBusyError(BrokerError):
    code = pb.ConsumerBusy


class ProducerBusyError(BrokerError):
    code = pb.ProducerBusy


class ServiceNotReadyError(BrokerError):
    code = pb.ServiceNotReady


class PersistenceError(BrokerError):
    code = pb.PersistenceError


class NotAllowedError(BrokerError):
    code = pb.NotAllowedError


class SubscriptionNotFoundError(BrokerError):
    code = pb.SubscriptionNotFound


class MetadataError(BrokerError):
    code = pb.MetadataError


class TopicExistsError(BrokerError):
    http_status = 409


class TopicBusyError(BrokerError):
    """Clients are connected and the operation was not forced (admin: 412)."""

    http_status = 412


class TopicTerminatedError(BrokerError):
    code = pb.TopicTerminatedError


class PolicyValidationError(BrokerError):
    """A policy breaks Pulsar's validation rules. The admin API answers ``http_status``: 400 unless
    Pulsar answers that rule with another status (412, 406)."""

    http_status = 400


class NamespaceNotFoundError(BrokerError):
    """The namespace does not exist (admin: 404)."""

    http_status = 404


class ConcurrentModificationError(BrokerError):
    """A compare-and-swap update kept losing to concurrent writers (admin: 409)."""

    http_status = 409


class AuthenticationError(BrokerError):
    """The client could not be authenticated (bad, expired or missing credentials): HTTP 401."""

    code = pb.AuthenticationError
    http_status = 401


class AuthorizationError(BrokerError):
    """The authenticated role may not do this: HTTP 403."""

    code = pb.AuthorizationError
    http_status = 403


def storage_error_code(exc: BaseException) -> pb.ServerError | None:
    """Pulsar's error code for a failure of storage or metadata a request can meet in normal operation
    (the topic fenced or closed under it, a timeout), or None for anything else (a bug)."""
    if isinstance(exc, CursorNotFoundError):
        return pb.SubscriptionNotFound
    if isinstance(exc, (ManagedLedgerFencedError, ManagedLedgerClosedError, TimeoutError)):
        return pb.ServiceNotReady
    if isinstance(exc, (ManagedLedgerError, LedgerError)):
        return pb.PersistenceError
    if isinstance(exc, StoreMetadataError):
        return pb.MetadataError
    return None
