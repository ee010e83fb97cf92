"""gRPC transport of the coordinator."""

from geofl.server.transport.servicer import CoordinatorServicer, ServerState, add_to_server

__all__ = ["CoordinatorServicer", "ServerState", "add_to_server"]
