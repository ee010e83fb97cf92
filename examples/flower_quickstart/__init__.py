"""Flower quickstart: a Flower 1.42 message-API ClientApp run unchanged by geofl."""
