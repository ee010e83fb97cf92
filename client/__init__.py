"""geofl's client side: the training API, the runtime, and the command line.

Import the torch helper explicitly (``geofl.client.torch``) so that a client
without torch still imports this package.
"""

from geofl.client.app import Client, ClientAppError, ClientContext, load_client_app
from geofl.client.partition import dirichlet_partition, iid_partition, label_histogram
from geofl.client.runtime import ClientOptions, ClientRuntime, GaveUpError

__all__ = [
    "Client",
    "ClientAppError",
    "ClientContext",
    "ClientOptions",
    "ClientRuntime",
    "GaveUpError",
    "dirichlet_partition",
    "iid_partition",
    "label_histogram",
    "load_client_app",
]
