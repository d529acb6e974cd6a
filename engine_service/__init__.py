"""Conduit's inference engine: a continuous-batching loop on PyTorch behind a gRPC service."""
