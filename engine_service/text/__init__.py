"""Text in and out: prompts and chat templates, detokenization, stop strings, constraints, tool calls."""
