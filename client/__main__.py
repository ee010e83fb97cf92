"""``python -m geofl.client``: the client without the server's dependencies."""

from geofl.client.cli import main

raise SystemExit(main())
