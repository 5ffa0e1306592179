"""The node side of burn-in: `gpufleet-burnin KIND --seconds N [--option value ...]`, the program each
burn-in step job runs on the node under test (lifecycle.profiles builds its command line).

It measures and prints one result line (protocol.burnin.format_result); the head judges the value
against the profile's threshold. Modules by family: cpu (stress-ng), disk (fio), collective (all-reduce
over torch.distributed), network (TCP or ib_write_bw between nodes), gpu (torch on CUDA: compute,
copies, heat), dcgm (dcgmi diag); main reads the command line, common holds what they share.
"""
