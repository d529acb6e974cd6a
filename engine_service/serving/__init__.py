"""The gRPC face: the conduit.v1.Engine servicer, health and reflection, and proto <-> engine conversion."""
