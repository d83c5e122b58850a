"""gpupool's wire contracts: CloudEvents envelope, event payloads, commands, subjects. Pydantic only."""
