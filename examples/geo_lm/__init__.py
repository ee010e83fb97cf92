"""Geo-distributed training of a byte-level language model on the standard library's source."""
