"""Where this node is plugged: LLDP neighbours from lldpd (`lldp`) and the InfiniBand fabric from
`ibnetdiscover` (`ibnet`)."""
