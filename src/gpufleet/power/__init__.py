"""Power control through nodes' BMCs: Redfish and IPMI behind one protocol, bulk actions as tasks."""
