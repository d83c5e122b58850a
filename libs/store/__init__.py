"""The only package that imports asyncpg: pools, migrations, unit of work, outbox relay, inbox."""
