"""Provisioning: networks and node addresses, and the network-boot configuration rendered from them."""
