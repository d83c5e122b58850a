"""What every service process shares: settings base, the runtime that wires bus + store + observability, and a
tiny HTTP endpoint for /metrics, /healthz and /readyz."""
