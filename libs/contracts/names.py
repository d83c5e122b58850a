"""Names as every edge checks them (teams, projects, orgs, clusters, priority classes): lower-case DNS-like
labels. A plain constant, for domain modules that check a name without importing the wire models."""

NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
