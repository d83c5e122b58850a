"""Running the platform locally: embedded NATS and PostgreSQL servers (servers.py), the `gpupool up` supervisor
(stack.py), the bus's identities and permissions (nats_auth.py) and their export for compose and Kubernetes
(nats_export.py). The benchmarks (libs/bench) and the chaos suite (libs/chaos) stand on it."""
