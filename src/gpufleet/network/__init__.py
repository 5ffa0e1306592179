"""Network beyond the node: switches over SNMP, the fabric's topology (LLDP, InfiniBand), and what the head
keeps of them."""
