"""Broker exceptions that map onto Pulsar's ``ServerError`` codes."""

from __future__ import annotations

from magnetar.broker.protocol import pulsar_api_pb2 as pb


class BrokerError(Exception):
    """A failure reported to the client with a Pulsar ``ServerError`` code."""

    code: int = pb.UnknownError

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

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
