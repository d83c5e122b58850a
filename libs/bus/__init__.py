"""The only package that imports nats: streams, publisher, pull consumers with DLQ, request/reply."""
