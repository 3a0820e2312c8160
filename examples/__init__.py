"""Example handlers for retrylib jobs; conf/orders.toml names `examples.handlers:enrich_order`."""
