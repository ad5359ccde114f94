"""Topic names: ``{persistent|non-persistent}://tenant/namespace/topic`` and the short forms clients accept."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from magnetar.broker.errors import InvalidTopicNameError

PARTITION_SUFFIX = "-partition-"
DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
_NAMED_ENTITY = re.compile(r"^[-=:.\w]+$")
_PARTITION_INDEX = re.compile(r"0|[1-9][0-9]{0,9}")
_INT32_MAX = 2**31 - 1


def _invalid(message: str) -> InvalidTopicNameError:
    # Imported when a name is bad: the errors module loads the protocol's protobuf classes, which the Spark
    # source's per-query planner process (that parses names) otherwise never needs.
    from magnetar.broker.errors import InvalidTopicNameError

    return InvalidTopicNameError(message)


def check_named_entity(kind: str, name: str) -> None:
    """Tenant, namespace, cluster names: Pulsar's allowed characters (letters, digits, ``-=:._``)."""
    if not name or not _NAMED_ENTITY.match(name):
        raise _invalid(f"Invalid {kind} name: '{name}'")


@dataclass(frozen=True, slots=True)
class TopicName:
    """A parsed, validated topic name."""

    domain: str
    tenant: str
    namespace_portion: str
    local_name: str
    #: ``str(self)``, made once: the broker's topic map and the policy cache key on the same string.
    _str: str | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def parse(cls, name: str) -> TopicName:
        """Parse a full or short name; raises :class:`InvalidTopicNameError`."""
        if not name or any(ord(c) < 0x20 for c in name):
            raise _invalid(f"Invalid topic name: '{name}'")
        if "://" not in name:
            parts = name.split("/")
            if len(parts) == 1:
                name = f"persistent://{DEFAULT_TENANT}/{DEFAULT_NAMESPACE}/{name}"
            elif len(parts) == 3:
                name = f"persistent://{name}"
            else:
                raise _invalid(
                    f"Invalid short topic name '{name}', it should be in the format of "
                    "<tenant>/<namespace>/<topic> or <topic>"
                )
        domain, _, rest = name.partition("://")
        if domain not in ("persistent", "non-persistent"):
            raise _invalid(f"Invalid topic domain in '{name}'")
        parts = rest.split("/", 2)
        if len(parts) != 3 or not parts[2]:
            raise _invalid(f"Invalid topic name: '{name}'")
        tenant, namespace, local = parts
        check_named_entity("tenant", tenant)
        check_named_entity("namespace", namespace)
        if "/" in local:
            # V1 names (tenant/cluster/namespace/topic) are not supported.
            raise _invalid(f"Invalid topic name: '{name}' (cluster-qualified names are not supported)")
        # Interned: thousands of topics share a few tenants and namespaces (one string each, not one per topic).
        return cls(sys.intern(domain), sys.intern(tenant), sys.intern(namespace), local)

    @property
    def persistent(self) -> bool:
        return self.domain == "persistent"

    @property
    def namespace(self) -> str:
        return f"{self.tenant}/{self.namespace_portion}"

    @property
    def partition_index(self) -> int:
        """The partition number for ``...-partition-N`` names, else -1.

        As Pulsar's ``TopicName.getPartitionIndex``: N must be a canonical int32 (ASCII digits, no leading
        zero); anything else (``-partition-99999999999``, ``-partition-007``, other scripts' digits) is an
        ordinary topic name, not a partition.
        """
        base, sep, index = self.local_name.rpartition(PARTITION_SUFFIX)
        if sep and base and _PARTITION_INDEX.fullmatch(index):
            value = int(index)
            if value <= _INT32_MAX:
                return value
        return -1

    @property
    def partitioned_base(self) -> TopicName:
        """The partitioned topic this partition belongs to (itself if not a partition)."""
        if self.partition_index < 0:
            return self
        return TopicName(
            self.domain, self.tenant, self.namespace_portion, self.local_name.rpartition(PARTITION_SUFFIX)[0]
        )

    def partition(self, index: int) -> TopicName:
        return TopicName(
            self.domain, self.tenant, self.namespace_portion, f"{self.local_name}{PARTITION_SUFFIX}{index}"
        )

    @property
    def persistence_name(self) -> str:
        """Managed-ledger name: ``tenant/ns/persistent/<url-encoded local name>`` as Pulsar encodes it."""
        return f"{self.tenant}/{self.namespace_portion}/{self.domain}/{quote(self.local_name, safe='')}"

    def __str__(self) -> str:
        s = self._str
        if s is None:
            s = f"{self.domain}://{self.tenant}/{self.namespace_portion}/{self.local_name}"
            object.__setattr__(self, "_str", s)  # a cache, not a field: frozen all the same
        return s
