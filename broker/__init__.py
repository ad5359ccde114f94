"""Magnetar broker: Pulsar binary protocol, topics, subscriptions and dispatchers."""
