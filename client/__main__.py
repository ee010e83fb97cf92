"""``python -m geofl.client``: the client without the server's dependencies."""

from geofl.client.cli import exit_process, main

exit_process(main())
