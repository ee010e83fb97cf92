"""gRPC transport of the coordinator."""

from geofl.server.transport.servicer import CoordinatorServicer, ServerState

__all__ = ["CoordinatorServicer", "ServerState"]
