"""The engine core: requests and sequences, scheduling, KV block accounting, sampling, the step loop."""
