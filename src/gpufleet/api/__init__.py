"""The head node's HTTP side: app factory, routers (HTTP translation only), dependencies."""
