"""Software assets and CVE impact: what runs on every node, and which advisories touch it."""
