"""The Magnetar Kubernetes operator: Tenant, TopicNamespace, Topic and RetentionPolicy resources applied
through the admin REST API (``magnetar operator``)."""
