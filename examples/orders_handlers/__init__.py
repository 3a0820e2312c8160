"""Example handlers for retrylib jobs: conf/orders.toml and the deploy/ configs name
`orders_handlers.handlers:enrich_order`. A project to copy for your own (its pyproject.toml
builds the wheel a cluster installs)."""
