"""Real models: loading, the KV-cache session with tree attention, drafters, the decode loop."""
