"""Load generator that measures Conduit (through the shim and over gRPC) beside llama.cpp."""
