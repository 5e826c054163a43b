"""The edge env's server models, one module each with the same pure signature
(``envs.servers.base.Server``), chosen through ``envs.servers.registry``: ``paper`` (the
FLOP-only clock's fixed-slot server), ``legacy`` (the batching server before issue 41) and
``serving`` (continuous batching with its prefix cache)."""
