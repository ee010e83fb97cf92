"""geofl."""
