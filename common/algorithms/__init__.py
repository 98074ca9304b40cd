"""The algorithms' math as small pure functions: local optimisers, losses and control variates, SAM and FedSynSAM's ascent, FedCOG's generation and KD terms, topologies and gossip."""
