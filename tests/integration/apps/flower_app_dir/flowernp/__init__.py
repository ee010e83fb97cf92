"""flowernp: a NumPy-only Flower app."""
