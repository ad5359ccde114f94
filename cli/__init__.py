"""The ``magnetar`` command line."""
