"""What the engine, the HTTP shim and the clients share beyond the wire contract (conduit.v1):
logging with request ids, command lines whose flags read environment variables, child processes
that die with their parent, and the typed results a Generate stream folds into. Nothing here
imports torch or grpc's server side, so every process can import it (flagdoc.py, which writes
docs/flags.md, imports the programs' parsers only when it runs)."""
