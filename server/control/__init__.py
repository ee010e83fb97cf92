"""The coordinator's control plane: admin credentials, the control gRPC service, its client.

:mod:`~geofl.server.control.admins` holds who may operate the coordinator (admin keys,
session tokens, one-time dashboard login links); the service and client modules carry
``geofl runs list|show|stop|logs|pull --server``.
"""
