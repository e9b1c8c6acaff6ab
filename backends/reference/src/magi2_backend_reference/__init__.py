"""magi2-backend-reference: exact reference providers (any device) and torch-native providers."""

__version__ = "0.1.0"
