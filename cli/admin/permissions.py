"""Permission verbs of ``magnetar admin namespaces`` and ``magnetar admin topics``, named as pulsar-admin's:
``permissions``, ``grant-permission``, ``revoke-permission``, ``grant-subscription-permission``,
``revoke-subscription-permission``, ``get-subscription-permission``, ``set-subscription-auth-mode``,
``get-subscription-auth-mode``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from magnetar.admin_client.paths import namespace_path, segment, topic_path
from magnetar.cli.admin.verbs import Handler, csv_list

#: The verb registrar of a group (``ns_verb`` / ``t_verb``): name, help text, handler -> its parser.
Registrar = Callable[[str, str, Handler], argparse.ArgumentParser]

ACTIONS = ("produce", "consume", "functions", "sources", "sinks", "packages")


def _actions(value: str) -> list[str]:
    actions = csv_list(value)
    unknown = [a for a in actions if a not in ACTIONS]
    if unknown or not actions:
        raise argparse.ArgumentTypeError(f"actions must be a comma list of {', '.join(ACTIONS)}")
    return actions


def _grant_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--role", required=True, help="client role to which to grant permissions")
    p.add_argument("--actions", type=_actions, required=True, help="comma list, e.g. produce,consume")


def add_namespace_verbs(ns_verb: Registrar) -> None:
    """The namespace permission verbs (``ns_verb`` adds the ``tenant/namespace`` argument)."""

    def path(a: argparse.Namespace, suffix: str) -> str:
        return namespace_path(*a.namespace) + suffix

    ns_verb("permissions", "Get the permissions on a namespace", lambda c, a: c.get(path(a, "/permissions")))
    p = ns_verb(
        "grant-permission",
        "Grant permissions on a namespace to a role",
        lambda c, a: c.call("POST", path(a, f"/permissions/{segment(a.role)}"), body=a.actions),
    )
    _grant_args(p)
    p = ns_verb(
        "revoke-permission",
        "Revoke a role's permissions on a namespace",
        lambda c, a: c.call("DELETE", path(a, f"/permissions/{segment(a.role)}")),
    )
    p.add_argument("--role", required=True, help="client role from which to revoke permissions")
    ns_verb(
        "get-subscription-permission",
        "Get the roles allowed on each subscription of a namespace",
        lambda c, a: c.get(path(a, "/permissions/subscription")),
    )
    p = ns_verb(
        "grant-subscription-permission",
        "Allow only these roles to use a subscription",
        lambda c, a: c.call("POST", path(a, f"/permissions/subscription/{segment(a.subscription)}"), body=a.roles),
    )
    p.add_argument("--subscription", required=True, help="subscription name")
    p.add_argument("--roles", type=csv_list, required=True, help="comma list of client roles")
    p = ns_verb(
        "revoke-subscription-permission",
        "Remove a role from a subscription's allowed roles",
        lambda c, a: c.call("DELETE", path(a, f"/permissions/{segment(a.subscription)}/{segment(a.role)}")),
    )
    p.add_argument("--subscription", required=True, help="subscription name")
    p.add_argument("--role", required=True, help="client role")
    p = ns_verb(
        "set-subscription-auth-mode",
        "Set the subscription auth mode (Prefix: names must start with the role)",
        lambda c, a: c.call("POST", path(a, "/subscriptionAuthMode"), body=a.subscription_auth_mode),
    )
    p.add_argument("-m", "--subscription-auth-mode", required=True, choices=["None", "Prefix"])
    ns_verb(
        "get-subscription-auth-mode",
        "Get the subscription auth mode",
        lambda c, a: c.get(path(a, "/subscriptionAuthMode")),
    )


def add_topic_verbs(t_verb: Registrar) -> None:
    """The topic permission verbs (``t_verb`` adds the topic argument)."""
    t_verb(
        "permissions",
        "Get the permissions on a topic (its namespace's and its own)",
        lambda c, a: c.get(topic_path(a.topic) + "/permissions"),
    )
    p = t_verb(
        "grant-permission",
        "Grant permissions on a topic to a role",
        lambda c, a: c.call("POST", f"{topic_path(a.topic)}/permissions/{segment(a.role)}", body=a.actions),
    )
    _grant_args(p)
    p = t_verb(
        "revoke-permission",
        "Revoke a role's permissions on a topic",
        lambda c, a: c.call("DELETE", f"{topic_path(a.topic)}/permissions/{segment(a.role)}"),
    )
    p.add_argument("--role", required=True, help="client role from which to revoke permissions")
