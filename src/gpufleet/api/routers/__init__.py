"""Routers: translate HTTP to service calls and back, nothing more."""
