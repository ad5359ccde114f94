"""Security: who a client is (authentication) and what it may do (authorization).

``provider`` holds the seam every authentication method implements (token, basic, TLS client
certificates) and where the authenticated role is kept: :attr:`ServerConnection.role
<magnetar.broker.connection.ServerConnection.role>` on the binary protocol, :func:`request_role`
on HTTP. Authorization reads only the role, never how it was established.
"""
