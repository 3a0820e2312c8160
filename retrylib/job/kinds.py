"""Which kind of job a config runs: a handler job or a delay router, each its own type that
the start, the run and the `retrylib` commands ask what differs."""

from __future__ import annotations

from retrylib.config.model import AnyConfig, DelayRouterJobConfig
from retrylib.job.handler_job import HandlerJob
from retrylib.job.router_job import DelayRouterJob

JobKind = HandlerJob | DelayRouterJob


def kind_of(config: AnyConfig) -> JobKind:
    """The kind of job `config` describes: the one place that tells the two apart."""
    if isinstance(config, DelayRouterJobConfig):
        return DelayRouterJob(config)
    return HandlerJob(config)
