"""A client of the admin REST API v2 (Apache Pulsar's ``/admin/v2`` paths and JSON bodies).

``errors`` and ``paths`` are shared by every admin client; ``client`` is the synchronous one
(``urllib``, stdlib only) behind ``magnetar admin`` and the Spark data source, which also runs on
Spark executors. The operator's asynchronous client (``magnetar.operator.admin``) uses the same
errors and paths.
"""
