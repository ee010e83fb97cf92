"""Quickstart: an MLP on scikit-learn's digits, four clients, FedAvg."""
