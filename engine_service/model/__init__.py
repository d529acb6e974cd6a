"""The model: loading, the paged KV cache and attention, and running one packed step."""
