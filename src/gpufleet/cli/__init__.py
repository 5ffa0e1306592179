"""The command line: noun then verb (gpufleet node list). Talks to the head only through client.py."""
