"""Routing engine calls over replicas by prefix cache and load (issue 32): see router.py."""

from .policies import DEFAULT_BALANCE_ABS, DEFAULT_BALANCE_REL, DEFAULT_POLICY, POLICIES
from .router import DEFAULT_PREFIX_VIEW, PREFIX_VIEWS, RoutedEngine, Router, RoutingConfig

__all__ = ["DEFAULT_BALANCE_ABS", "DEFAULT_BALANCE_REL", "DEFAULT_POLICY", "DEFAULT_PREFIX_VIEW", "POLICIES",
           "PREFIX_VIEWS", "RoutedEngine", "Router", "RoutingConfig"]
